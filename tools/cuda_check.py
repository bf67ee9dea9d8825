"""Runs compiled programs on an NVIDIA GPU without Python there: modules are exported here with
`gl.export(..., target="cuda")`, run there with IREE's `iree-run-module` and timed with
`iree-benchmark-module`, and their results compared here with eager mode's.

    python tools/cuda_check.py prepare build/cuda_check    # modules, inputs, run.sh
    bash build/cuda_check/run.sh RUNTIME_DIR OUT_DIR        # on the GPU machine
    python tools/cuda_check.py compare build/cuda_check OUT_DIR

RUNTIME_DIR (an absolute path) holds the `iree-run-module` and `iree-benchmark-module` of
`iree-base-runtime` (`.venv/lib/python3.11/site-packages/iree/_runtime_libs`). The same bundle
runs on the CPU with `DEVICE=local-task` (the modules of `--target llvm-cpu`), which checks the
bundle itself.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
from collections.abc import Callable, Sequence

import numpy as np

import gradloop as gl
from gradloop import _iree_build, _runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benches")]

F32 = {"rtol": 2e-5, "atol": 2e-6}
#: The benchmarks' programs run 10^3 to 10^5 steps: float32 rounding accumulates.
F32_LONG = {"rtol": 1e-3, "atol": 1e-4}


def _leaves(x: object) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in _flat(x)]


def _flat(x: object) -> list[object]:
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _flat(item)]
    return [x]


def _cases() -> list[tuple[str, Callable, tuple, str]]:
    """(name, fn, args, what to time: "" for nothing, else the unit of one call)."""
    import compiled_mode
    import executor as executor_bench
    import run as run_bench

    import test_compiled_targets

    cases = [(name, fn, args, "") for name, fn, args in test_compiled_targets.PROGRAMS]
    rng = np.random.default_rng(0)
    w, u, b, xs, limit = compiled_mode.rnn_inputs(rng)
    cases.append(("W6-rnn-gradient", compiled_mode.rnn_grad, (w, u, b, xs, limit), "call"))
    x16 = gl.tensor(np.linspace(-1.0, 1.0, 16, dtype=np.float32))
    for n in (10_000, 100_000):
        cases.append((f"W5-tiny-loop-{n}", executor_bench.w5, (x16, gl.tensor(n)), "call"))
    params = tuple(gl.tensor(p) for p in run_bench.init_mlp(np.random.default_rng(1)))
    x = gl.tensor(np.random.default_rng(2).standard_normal((run_bench.BATCH, 784), np.float32))
    onehot = np.zeros((run_bench.BATCH, 10), np.float32)
    onehot[np.arange(run_bench.BATCH), np.arange(run_bench.BATCH) % 10] = 1.0
    cases.append(("W4-mlp-step", compiled_mode.mlp_step, (params, x, gl.tensor(onehot)), "call"))
    return cases


def _function_name(mlir: str) -> str:
    for line in mlir.splitlines():
        if line.lstrip().startswith("func.func @"):
            return line.split("@", 1)[1].split("(", 1)[0]
    raise SystemExit("no public function in the exported module")


def prepare(out: pathlib.Path, target: str, bench: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest, lines = [], ["set -u", 'bin="$1"; results="$2"; mkdir -p "$results"']
    lines.append('device="${DEVICE:-cuda}"')
    # the flags `gl.jit` runs the driver with, so that the timings are its own
    driver_flags = _runtime.DRIVER_FLAGS.get(_iree_build.TARGETS[target], ())
    for name, fn, args, timed in _cases():
        case = out / name
        case.mkdir(exist_ok=True)
        try:
            gl.export(fn, *args, path=case / "module.vmfb", target=target)
        except gl.errors.GradloopError as e:
            print(f"{name}: not exported: {type(e).__name__}: {e}")
            continue
        function = _function_name((case / "module.mlir").read_text())
        inputs = [np.asarray(a) for a in _flat(args) if isinstance(a, gl.Tensor)]
        flags = [f"--module={name}/module.vmfb", f"--function={function}", *driver_flags]
        for i, value in enumerate(inputs):
            np.save(case / f"in{i}.npy", value)
            flags.append(f"--input=@{name}/in{i}.npy")
        expected = _leaves(fn(*args))
        for i, value in enumerate(expected):
            np.save(case / f"expected{i}.npy", value)
        outputs = [f'--output=@"$results"/{name}.out{i}.npy' for i in range(len(expected))]
        here = 'cd "$(dirname "$0")"'
        run = " ".join(["$bin/iree-run-module", '--device="$device"', *map(shlex.quote, flags)])
        lines.append(f"({here} && {run} {' '.join(outputs)} >/dev/null) 2>&1 | tail -3")
        lines.append(f'echo "{name}: rc=${{PIPESTATUS[0]}}"')
        if timed and bench:
            command = " ".join(
                [
                    "$bin/iree-benchmark-module",
                    '--device="$device"',
                    *map(shlex.quote, flags),
                    "--benchmark_repetitions=7",
                    "--benchmark_min_warmup_time=0.2",
                    "--benchmark_report_aggregates_only=true",
                ]
            )
            lines.append(f'({here} && {command}) > "$results"/{name}.bench.txt 2>&1')
        manifest.append({"name": name, "outputs": len(expected), "timed": bool(timed)})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "run.sh").write_text("\n".join(lines) + "\n")
    print(f"{len(manifest)} modules for {target} in {out}")


def compare(bundle: pathlib.Path, results: pathlib.Path) -> int:
    failures = 0
    for case in json.loads((bundle / "manifest.json").read_text()):
        name = case["name"]
        status = "ok"
        for i in range(case["outputs"]):
            want = np.load(bundle / name / f"expected{i}.npy")
            got_path = results / f"{name}.out{i}.npy"
            if not got_path.exists():
                status = f"output {i} missing"
                break
            got = np.load(got_path)
            tolerance = F32_LONG if case["timed"] else F32
            if got.shape != want.shape:
                status = f"output {i}: shape {got.shape}, expected {want.shape}"
                break
            if not np.allclose(got, want, **tolerance):
                worst = np.abs(got.astype(np.float64) - want).max()
                status = f"output {i} differs: max |diff| {worst}"
                break
        failures += status != "ok"
        timing = ""
        if case["timed"] and (results / f"{name}.bench.txt").exists():
            timing = _median((results / f"{name}.bench.txt").read_text())
        print(f"{name:32} {status} {timing}")
    return 1 if failures else 0


def _median(report: str) -> str:
    for line in report.splitlines():
        if "_median" in line:
            return "median " + " ".join(line.split()[1:3])
    return "(no timing)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("bundle", type=pathlib.Path)
    p.add_argument("--target", default="cuda")
    p.add_argument("--no-bench", action="store_true", help="run the modules without timing them")
    c = sub.add_parser("compare")
    c.add_argument("bundle", type=pathlib.Path)
    c.add_argument("results", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.bundle, args.target, bench=not args.no_bench)
        return 0
    return compare(args.bundle, args.results)


if __name__ == "__main__":
    raise SystemExit(main())
