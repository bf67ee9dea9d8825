//! A graph over lanes: `vmap` of a whole graph function, for callers that hold a graph rather
//! than the Python that traced it (an eager construct staged as a graph and run on lanes, or
//! its derivatives run inside a later `vmap`, `jacrev`'s).

use super::nodes::{lanes_type, replay_over_lanes};
use super::{new_level, LaneSet, Want};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::trace::{finish_entry, Tracer};

/// The graph whose entry `name` runs `graph`'s entry on `lanes` lanes at once: parameter `k`
/// holds every lane's value along axis 0 where `batched[k]` (else one value for all lanes), and
/// every result holds every lane's along axis 0. Each construct takes its batching rule (each
/// lane its own trips and branches), so each lane's results are the entry's on that lane.
pub fn lanes_graph(graph: &Graph, batched: &[bool], lanes: usize, name: &str) -> Result<Graph> {
    let f = graph.entry_function()?;
    if batched.len() != f.params.len() {
        return Err(Error::invalid(
            "vmap",
            format!(
                "@{} takes {} arguments, {} flags given",
                f.name,
                f.params.len(),
                batched.len()
            ),
        ));
    }
    if lanes == 0 {
        return Err(Error::invalid(
            "vmap",
            "a graph over lanes needs at least one lane",
        ));
    }
    let params = f
        .params
        .iter()
        .zip(batched)
        .map(|(t, &b)| {
            if b {
                lanes_type(t, lanes)
            } else {
                Ok(t.clone())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let (tracer, xs) = Tracer::with_library(graph.library.clone(), name, params);
    let set = LaneSet::root(new_level(), lanes);
    let (outs, _) = replay_over_lanes(&tracer, f, &xs, batched, &set, &|_| Want::Lanes)?;
    finish_entry(&tracer, &outs, "vmap")
}

#[cfg(test)]
mod tests {
    use super::lanes_graph;
    use crate::graph::parse_graph;
    use crate::interpret::{run_graph, RtValue};
    use crate::Tensor;

    // Halves `x` until it is below `stop`, counting the trips: each lane its own count.
    const HALVE: &str = r#"graph @halve
func @halve(%0: f64[], %1: f64[]) -> (f64[], i64[]) {
  %2 = const() {value=[0]} : i64[]
  %3 = while(%0, %2, %1) {cond=@more, body=@step, parallel_iterations=10} : (f64[], i64[], f64[])
  return %3#0, %3#1
}
func @more(%0: f64[], %1: i64[], %2: f64[]) -> (bool[]) {
  %3 = greater(%0, %2) : bool[]
  return %3
}
func @step(%0: f64[], %1: i64[], %2: f64[]) -> (f64[], i64[], f64[]) {
  %3 = const() {value=[0.5]} : f64[]
  %4 = mul(%0, %3) : f64[]
  %5 = const() {value=[1]} : i64[]
  %6 = add(%1, %5) : i64[]
  return %4, %6, %2
}"#;

    fn run(graph: &crate::graph::Graph, args: Vec<Tensor>) -> Vec<Tensor> {
        let args = args.into_iter().map(RtValue::from).collect();
        run_graph(graph, args)
            .unwrap()
            .into_iter()
            .map(|v| v.into_tensor().unwrap())
            .collect()
    }

    #[test]
    fn each_lane_makes_its_own_trips_and_unbatched_arguments_are_shared() {
        let graph = parse_graph(HALVE).unwrap();
        let xs = [1.0, 40.0, 3.0, 1000.0];
        let over = lanes_graph(&graph, &[true, false], 4, "halve_lanes").unwrap();
        let out = run(
            &over,
            vec![
                Tensor::from_vec(xs.to_vec(), &[4]).unwrap(),
                Tensor::scalar(2.0),
            ],
        );
        for (lane, &x) in xs.iter().enumerate() {
            let want = run(&graph, vec![Tensor::scalar(x), Tensor::scalar(2.0)]);
            assert_eq!(out[0].to_f64_vec()[lane], want[0].to_f64_vec()[0]);
            assert_eq!(out[1].to_f64_vec()[lane], want[1].to_f64_vec()[0]);
        }
        assert_eq!(out[1].to_f64_vec(), vec![0.0, 5.0, 1.0, 9.0]);
    }

    #[test]
    fn flags_that_do_not_match_the_parameters_are_invalid() {
        let graph = parse_graph(HALVE).unwrap();
        let err = lanes_graph(&graph, &[true], 4, "halve_lanes").unwrap_err();
        assert!(err.to_string().contains("takes 2 arguments"), "{err}");
        assert!(lanes_graph(&graph, &[true, true], 0, "halve_lanes").is_err());
    }
}
