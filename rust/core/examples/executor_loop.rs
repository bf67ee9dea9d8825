//! The frame executor from Rust: a data-dependent loop (`while i < n: x = 0.999 x + 0.001
//! sin(x)` on float32[16]) run on the executor and on the reference interpreter.
//!
//! `cargo run --release -p gradloop --example executor_loop [iterations [runner]]` prints
//! ns/iteration of each (medians of 5 runs); `runner` picks one: `interpreter`, `executor` (the
//! loop fused into one program, compiled to machine code and kernels on buffers), `buffers`
//! (the same kernels, the steps run one by one), `programs` (the same program interpreted), `frames` (the loop a frame of tokens), `frames-1` (the same on
//! one thread); `show` prints the executor's graph.

use std::time::Instant;

use gradloop::executor::{set_compiled_frames, CompiledFrames, Executor, Loops};
use gradloop::graph::parse_graph;
use gradloop::interpret::{Interpreter, RtValue};
use gradloop::Tensor;

/// W5's loop in graph text (shared with the executor's tests).
const LOOP: &str = include_str!("tiny_loop.graph");

/// One way to run the loop.
type Run<'a> = dyn Fn() -> gradloop::Result<Vec<RtValue>> + 'a;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> gradloop::Result<()> {
    let n: i32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let graph = parse_graph(LOOP)?;
    let x = Tensor::from_vec((0..16).map(|k| 0.1 * k as f32).collect(), &[16])?;
    let args = || vec![RtValue::from(x.clone()), RtValue::from(Tensor::scalar(n))];
    let interpreter = Interpreter::new(&graph.library);
    let executor = Executor::new(&graph)?;
    let frames = Executor::with_loops(&graph, Loops::Frames)?;
    let single = Executor::with_loops(&graph, Loops::Frames)?.with_threads(1);
    let time = |f: &dyn Fn() -> gradloop::Result<Vec<RtValue>>| -> gradloop::Result<f64> {
        let mut samples = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            f()?;
            samples.push(t.elapsed().as_secs_f64() * 1e9 / f64::from(n));
        }
        Ok(median(samples))
    };
    // A second argument runs one of them only (for profiling).
    let only = std::env::args().nth(2).unwrap_or_default();
    if only == "show" {
        println!("{}", executor.graph());
        return Ok(());
    }
    let with = |mode| {
        set_compiled_frames(mode);
        let results = executor.run(args());
        set_compiled_frames(CompiledFrames::On);
        results
    };
    let runs: [(&str, &Run); 6] = [
        ("interpreter", &|| interpreter.run(&graph.entry, args())),
        ("executor", &|| executor.run(args())),
        ("buffers", &|| with(CompiledFrames::Buffers)),
        ("programs", &|| with(CompiledFrames::Off)),
        ("frames", &|| frames.run(args())),
        ("frames-1", &|| single.run(args())),
    ];
    for (name, run) in runs {
        if only.is_empty() || only == name {
            println!("{name:<12} {:8.1} ns/iteration", time(run)?);
        }
    }
    Ok(())
}
