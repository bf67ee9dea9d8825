//! gradloop from Rust, without Python: a function whose loop runs a data-dependent number of
//! trips, its gradient, both run on the reference interpreter, and the MLIR that `gl.jit`
//! compiles with IREE.
//!
//! ```text
//! cargo run -p gradloop --example loop_gradient
//! ```
//!
//! The program: `while sum(x) < limit: x = x * 1.5 + sin(x)`, then `sum(tanh(x) * x)`. How many trips
//! it takes depends on `x`; its gradient with respect to `x` is taken through every trip.

use gradloop::graph::While;
use gradloop::graph::{parse_function, FunctionBuilder, Graph, Library, NodeKind, ValueType};
use gradloop::interpret::{run_graph, RtValue};
use gradloop::ops::{binary, reduce, unary};
use gradloop::trace::gradient_graph;
use gradloop::{mlir, DType, Result, Tensor};

/// The loop's condition and body, in graph text (the same text `print(concrete.graph)` shows).
const LOOP: [&str; 2] = [
    r#"func @grow_cond(%0: f64[3], %1: f64[]) -> (bool[]) {
  %2 = sum(%0) {axes=[0], keepdims=false} : f64[]
  %3 = less(%2, %1) : bool[]
  return %3
}"#,
    r#"func @grow_body(%0: f64[3], %1: f64[]) -> (f64[3], f64[]) {
  %2 = const() {value=[1.5]} : f64[]
  %3 = mul(%0, %2) : f64[3]
  %4 = sin(%0) : f64[3]
  %5 = add(%3, %4) : f64[3]
  return %5, %1
}"#,
];

/// `@main(x: f64[3], limit: f64[]) -> f64[]`, built node by node: each op's output type comes
/// from the op table's own shape rule, so a mistake fails here, with the op's error.
fn program() -> Result<Graph> {
    let mut library = Library::new();
    for text in LOOP {
        library.add(parse_function(text)?)?;
    }
    let vector = ValueType::tensor(DType::F64, &[3]);
    let scalar = ValueType::tensor(DType::F64, &[]);
    let (mut main, params) = FunctionBuilder::new("main", vec![vector, scalar]);
    let grow = NodeKind::While(While {
        cond: "grow_cond".into(),
        body: "grow_body".into(),
        maximum_iterations: None,
        parallel_iterations: 10,
        checkpoints: None,
    });
    let grown = main.add_call_node(grow, &params, &library)?;
    let squashed = main.add_op1(unary::Tanh, &[grown[0]], None)?;
    let square = main.add_op1(binary::Mul, &[squashed, grown[0]], None)?;
    let total = reduce::Sum {
        axes: vec![0],
        keepdims: false,
    };
    let loss = main.add_op1(total, &[square], None)?;
    library.add(main.finish(&[loss], &[])?)?;
    Graph::new(library, "main")
}

fn tensor(values: &[f64]) -> Result<RtValue> {
    Ok(Tensor::from_vec(values.to_vec(), &[values.len()])?.into())
}

fn values(results: Vec<RtValue>) -> Result<Vec<Vec<f64>>> {
    results
        .into_iter()
        .map(|r| Ok(r.into_tensor()?.to_f64_vec()))
        .collect()
}

fn main() -> Result<()> {
    let graph = program()?;
    println!("{graph}");
    let x = [0.3, -0.1, 0.2];
    let limit = RtValue::from(Tensor::scalar(10.0f64));
    let loss = values(run_graph(&graph, vec![tensor(&x)?, limit.clone()])?)?;
    println!("loss = {:.6}", loss[0][0]);

    // d loss / d x through every trip: a new graph whose loop pushes what the backward loop
    // pops (`gl.grad` builds the same one).
    let grad = gradient_graph(&graph, &[0], "main_grad")?;
    let dx = values(run_graph(&grad, vec![tensor(&x)?, limit.clone()])?)?;
    println!("d loss / d x = {:.6?}", dx[0]);

    // the same gradient by central differences: the trip count is locally constant
    let h = 1e-6;
    let numeric: Vec<f64> = (0..x.len())
        .map(|i| {
            let at = |d: f64| -> Result<f64> {
                let mut shifted = x;
                shifted[i] += d;
                let out = values(run_graph(&graph, vec![tensor(&shifted)?, limit.clone()])?)?;
                Ok(out[0][0])
            };
            Ok((at(h)? - at(-h)?) / (2.0 * h))
        })
        .collect::<Result<_>>()?;
    println!("finite differences = {numeric:.6?}");
    for (a, b) in dx[0].iter().zip(&numeric) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }

    // what gl.jit hands to IREE: StableHLO inside scf.while, the tape as growable buffers
    let text = mlir::emit_module(&grad)?;
    println!("{text}");
    Ok(())
}
