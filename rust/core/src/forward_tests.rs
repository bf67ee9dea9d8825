use super::*;
use crate::ops::{build, EagerContext};
use crate::tensor::Tensor;

fn vec(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

/// The context a forward pass over `accs` runs ops through: outputs on the heap, as the
/// runtime's contexts keep them while accumulators are active.
struct Heap;

impl Context<Tensor> for Heap {
    fn apply(&mut self, op: &Op, inputs: &[Tensor]) -> Result<Values<Tensor>> {
        Ok(EagerContext
            .apply(op, inputs)?
            .into_iter()
            .map(Tensor::on_heap)
            .collect())
    }
}

fn forward<'a>(
    inner: &'a mut Heap,
    accs: &'a [AccumulatorRef<Tensor>],
    registry: &'a GradientRegistry<Tensor>,
) -> ForwardContext<'a, Tensor> {
    let accs = &accs[..accs.len().min(2)];
    ForwardContext {
        inner,
        tapes: &[],
        accumulators: accs,
        tapes_below: &[0, 0],
        registry,
    }
}

#[test]
fn tangents_follow_the_ops_tangent_rules() {
    let registry = GradientRegistry::new();
    let acc = ForwardAccumulator::new_ref();
    let x = vec(&[0.5, -1.0]).on_heap();
    lock(&acc).watch(&x, vec(&[1.0, 2.0])).unwrap();
    let accs = [acc.clone()];
    let mut heap = Heap;
    let mut ctx = forward(&mut heap, &accs, &registry);
    let s = build::sin(&mut ctx, &x).unwrap();
    let y = build::mul(&mut ctx, &s, &x).unwrap();
    let t = lock(&acc).tangent(&y).unwrap().to_f64_vec();
    for (i, (&xi, ti)) in [0.5f64, -1.0].iter().zip([1.0, 2.0]).enumerate() {
        let want = (xi.cos() * xi + xi.sin()) * ti;
        assert!((t[i] - want).abs() < 1e-14, "{} vs {want}", t[i]);
    }
    let c = build::fill(&mut ctx, crate::DType::F64, &[2], 3.0).unwrap();
    assert!(
        lock(&acc).tangent(&c).is_none(),
        "a constant has no tangent"
    );
}

#[test]
fn nested_accumulators_give_second_derivatives() {
    // d/da d/db exp(x) with both tangents 1: exp(x)
    let registry = GradientRegistry::new();
    let (outer, inner) = (ForwardAccumulator::new_ref(), ForwardAccumulator::new_ref());
    let x = vec(&[0.3]).on_heap();
    lock(&outer).watch(&x, vec(&[1.0])).unwrap();
    let accs = [outer.clone(), inner.clone()];
    let mut heap = Heap;
    let mut ctx = forward(&mut heap, &accs, &registry);
    let x1 = build::identity(&mut ctx, &x).unwrap();
    lock(&inner).watch(&x1, vec(&[1.0]).on_heap()).unwrap();
    let y = build::exp(&mut ctx, &x1).unwrap();
    let dy = lock(&inner).tangent(&y).unwrap();
    let ddy = lock(&outer).tangent(&dy).unwrap().to_f64_vec();
    assert!((ddy[0] - 0.3f64.exp()).abs() < 1e-14);
}

#[test]
fn entries_whose_values_are_gone_are_swept() {
    let registry = GradientRegistry::new();
    let acc = ForwardAccumulator::new_ref();
    let mut h = vec(&[0.1, 0.2, 0.3]).on_heap();
    lock(&acc).watch(&h, vec(&[1.0, 1.0, 1.0])).unwrap();
    let accs = [acc.clone()];
    let mut heap = Heap;
    let mut ctx = forward(&mut heap, &accs, &registry);
    for _ in 0..20 * SWEEP_FLOOR {
        h = build::sin(&mut ctx, &h).unwrap();
    }
    let n = lock(&acc).len();
    assert!(
        n <= 2 * SWEEP_FLOOR + 1,
        "{n} entries kept for one live value"
    );
    assert!(
        lock(&acc).tangent(&h).is_some(),
        "the live value keeps its tangent"
    );
}

#[test]
fn watch_checks_the_tangent() {
    let acc: AccumulatorRef<Tensor> = ForwardAccumulator::new_ref();
    let ints = Tensor::from_vec(vec![1i32, 2], &[2]).unwrap();
    let err = lock(&acc).watch(&ints, vec(&[1.0, 1.0])).unwrap_err();
    assert!(err.to_string().contains("int32"), "{err}");
    let err = lock(&acc)
        .watch(&vec(&[1.0]), vec(&[1.0, 2.0]))
        .unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}
