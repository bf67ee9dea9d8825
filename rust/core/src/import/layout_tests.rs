//! Importer tests: the layout, contraction and reduction rows of the mapping table run on the
//! interpreter against index arithmetic.

use super::tests::{assert_all_close, f64s, module, one_op, run};
use crate::tensor::Tensor;

/// `0, 1, 2, ...` of `shape`.
fn iota(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    f64s(&(0..n).map(|i| i as f64).collect::<Vec<_>>(), shape)
}

#[test]
fn layout_ops_move_elements_as_stablehlo_says() {
    // broadcast_in_dim with unsorted dimensions: y[i, j, k] = x[j, i].
    let x = iota(&[2, 3]);
    let attrs = "{broadcast_dimensions = array<i64: 1, 0>}";
    let y = one_op(
        "stablehlo.broadcast_in_dim",
        &["tensor<2x3xf64>"],
        "tensor<3x2x4xf64>",
        attrs,
        std::slice::from_ref(&x),
    );
    let want: Vec<f64> = (0..3)
        .flat_map(|i| (0..2).flat_map(move |j| (0..4).map(move |_| (3 * j + i) as f64)))
        .collect();
    assert_eq!(y.to_f64_vec(), want);
    let y = one_op(
        "stablehlo.iota",
        &[],
        "tensor<2x3xi32>",
        "{iota_dimension = 1 : i64}",
        &[],
    );
    assert_eq!(y.as_slice::<i32>().unwrap(), [0, 1, 2, 0, 1, 2]);
    let y = one_op(
        "stablehlo.transpose",
        &["tensor<2x3xf64>"],
        "tensor<3x2xf64>",
        "{permutation = array<i64: 1, 0>}",
        std::slice::from_ref(&x),
    );
    assert_eq!(y.to_f64_vec(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let y = one_op(
        "stablehlo.reshape",
        &["tensor<2x3xf64>"],
        "tensor<6xf64>",
        "",
        std::slice::from_ref(&x),
    );
    assert_eq!(y.shape(), [6]);
    let attrs = "{start_indices = array<i64: 0, 1>, limit_indices = array<i64: 2, 3>, strides = array<i64: 1, 2>}";
    let y = one_op(
        "stablehlo.slice",
        &["tensor<2x3xf64>"],
        "tensor<2x1xf64>",
        attrs,
        std::slice::from_ref(&x),
    );
    assert_eq!(y.to_f64_vec(), [1.0, 4.0]);
    let y = one_op(
        "stablehlo.concatenate",
        &["tensor<2x3xf64>", "tensor<2x3xf64>"],
        "tensor<2x6xf64>",
        "{dimension = 1 : i64}",
        &[x.clone(), x.clone()],
    );
    assert_eq!(y.to_f64_vec()[..6], [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
    let y = one_op(
        "stablehlo.reverse",
        &["tensor<2x3xf64>"],
        "tensor<2x3xf64>",
        "{dimensions = array<i64: 1>}",
        std::slice::from_ref(&x),
    );
    assert_eq!(y.to_f64_vec(), [2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
    let attrs = "{edge_padding_low = array<i64: 1>, edge_padding_high = array<i64: 0>, interior_padding = array<i64: 1>}";
    let y = one_op(
        "stablehlo.pad",
        &["tensor<2xf64>", "tensor<f64>"],
        "tensor<4xf64>",
        attrs,
        &[f64s(&[5.0, 6.0], &[2]), Tensor::scalar(-1.0)],
    );
    assert_eq!(y.to_f64_vec(), [-1.0, 5.0, -1.0, 6.0]);
    let i = Tensor::scalar(1i64);
    let y = one_op(
        "stablehlo.dynamic_slice",
        &["tensor<2x3xf64>", "tensor<i64>", "tensor<i64>"],
        "tensor<1x2xf64>",
        "{slice_sizes = array<i64: 1, 2>}",
        &[x.clone(), i.clone(), i.clone()],
    );
    assert_eq!(y.to_f64_vec(), [4.0, 5.0]);
    let u = f64s(&[9.0, 9.0], &[1, 2]);
    let y = one_op(
        "stablehlo.dynamic_update_slice",
        &[
            "tensor<2x3xf64>",
            "tensor<1x2xf64>",
            "tensor<i64>",
            "tensor<i64>",
        ],
        "tensor<2x3xf64>",
        "",
        &[x, u, i.clone(), i],
    );
    assert_eq!(y.to_f64_vec(), [0.0, 1.0, 2.0, 3.0, 9.0, 9.0]);
}

#[test]
fn dot_general_is_one_batched_matrix_product() {
    // Batch 0, contract lhs 1 with rhs 2: out[b, i, j] = sum_k a[b, k, i] * c[b, j, k].
    let (a, c) = (iota(&[2, 3, 4]), iota(&[2, 5, 3]));
    let attrs = "{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], \
                 rhs_batching_dimensions = [0], lhs_contracting_dimensions = [1], \
                 rhs_contracting_dimensions = [2]>}";
    let types = ["tensor<2x3x4xf64>", "tensor<2x5x3xf64>"];
    let y = one_op(
        "stablehlo.dot_general",
        &types,
        "tensor<2x4x5xf64>",
        attrs,
        &[a.clone(), c.clone()],
    );
    let (av, cv) = (a.to_f64_vec(), c.to_f64_vec());
    let mut want = Vec::new();
    for b in 0..2 {
        for i in 0..4 {
            for j in 0..5 {
                want.push(
                    (0..3)
                        .map(|k| av[b * 12 + k * 4 + i] * cv[b * 15 + j * 3 + k])
                        .sum(),
                );
            }
        }
    }
    assert_all_close(&y.to_f64_vec(), &want, "dot_general");
    let m = iota(&[2, 3]);
    let v = f64s(&[1.0, -1.0, 2.0], &[3]);
    let y = one_op(
        "stablehlo.dot",
        &["tensor<2x3xf64>", "tensor<3xf64>"],
        "tensor<2xf64>",
        "",
        &[m, v],
    );
    assert_eq!(y.to_f64_vec(), [3.0, 9.0]);
}

/// A `reduce` over `dims` whose region applies `combiner` (of `element` type).
fn reduce(
    combiner: &str,
    element: &str,
    ty: &str,
    out: &str,
    dims: &str,
    args: &[Tensor],
) -> Tensor {
    let dims = if dims.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {dims}>")
    };
    let body = format!(
        "    %0 = \"stablehlo.reduce\"(%arg0, %arg1) <{{dimensions = {dims}}}> ({{\n    \
         ^bb0(%a: {element}, %b: {element}):\n      %s = \"{combiner}\"(%a, %b) : ({element}, \
         {element}) -> {element}\n      \"stablehlo.return\"(%s) : ({element}) -> ()\n    }}) : \
         ({ty}, {element}) -> {out}"
    );
    let text = module(&[ty, element], &[out], &body, &["%0"]);
    run(&text, args)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .remove(0)
}

#[test]
fn reductions_combine_their_initial_value() {
    let x = iota(&[2, 3]);
    let e = "tensor<f64>";
    let y = reduce(
        "stablehlo.add",
        e,
        "tensor<2x3xf64>",
        "tensor<2xf64>",
        "1",
        &[x.clone(), Tensor::scalar(10.0)],
    );
    assert_eq!(y.to_f64_vec(), [13.0, 22.0]);
    let y = reduce(
        "stablehlo.maximum",
        e,
        "tensor<2x3xf64>",
        "tensor<3xf64>",
        "0",
        &[x.clone(), Tensor::scalar(f64::NEG_INFINITY)],
    );
    assert_eq!(y.to_f64_vec(), [3.0, 4.0, 5.0]);
    let y = reduce(
        "stablehlo.minimum",
        e,
        "tensor<2x3xf64>",
        "tensor<f64>",
        "0, 1",
        &[x.clone(), Tensor::scalar(-2.0)],
    );
    assert_eq!(y.to_f64_vec(), [-2.0]);
    let y = reduce(
        "stablehlo.add",
        e,
        "tensor<2x3xf64>",
        "tensor<2x3xf64>",
        "",
        &[x, Tensor::scalar(1.0)],
    );
    assert_eq!(y.to_f64_vec(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = Tensor::from_vec(vec![true, false, true, true], &[2, 2]).unwrap();
    let (bt, i1) = ("tensor<2x2xi1>", "tensor<i1>");
    let y = reduce(
        "stablehlo.and",
        i1,
        bt,
        "tensor<2xi1>",
        "1",
        &[b.clone(), Tensor::scalar(true)],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), [false, true]);
    let y = reduce(
        "stablehlo.or",
        i1,
        bt,
        "tensor<2xi1>",
        "0",
        &[b, Tensor::scalar(false)],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), [true, true]);
}
