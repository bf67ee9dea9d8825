#!/usr/bin/env python3
"""Parse and verify MLIR files with the MLIR bindings of `iree-base-compiler`; optionally
compile them with `iree-compile` and run them with `iree-run-module`.

    python tools/check_mlir.py DIR_OR_FILES...            # parse + verify every *.mlir
    python tools/check_mlir.py --run DIR_OR_FILES...      # also compile and run the modules
                                                          # that have a NAME.json beside them
    python tools/check_mlir.py --run --flag=--iree-execution-model=inline-dynamic DIR
                                                          # extra iree-compile flags

A `NAME.json` (written by the Rust emitter tests, see `rust/core/src/mlir/check.rs`) holds
`{"function": "main", "runs": [{"inputs": [T, ...], "expected": [T, ...]}, ...]}` with each
tensor `T` as `{"dtype": "f32", "shape": [3], "data": [...]}`: the module is compiled once, run
once per entry of `runs` (inputs fed through `.npy` files), and every result is compared with
the expected one (the Rust interpreter's output) with numpy's `allclose`. Exits non-zero when
anything fails; prints one line per module.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

DEVICE = os.environ.get("GRADLOOP_IREE_DEVICE", "local-task")

RUN_TIMEOUT_S = 60

DTYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "bool": "bool"}


def parse_and_verify(text: str) -> str | None:
    """None when `text` parses and verifies, else the diagnostic."""
    from iree.compiler import ir

    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # MLIRError: the parser's diagnostics
            return f"parse: {e}"
        if not module.operation.verify():
            return "verify: failed"
    return None


def compile_flags(uses_f64: bool) -> list[str]:
    flags = [
        "--iree-input-type=stablehlo",
        "--iree-hal-target-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ]
    if uses_f64:
        # Keep f64 (IREE demotes it by default) and link libm for f64 transcendentals.
        flags += ["--iree-input-demote-f64-to-f32=false", "--iree-llvmcpu-link-embedded=false"]
    return flags


def tensor(spec: dict):
    import numpy as np

    return np.array(spec["data"], dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"])


def run_module(
    mlir: pathlib.Path, spec: dict, bin_dir: pathlib.Path, extra: list[str]
) -> str | None:
    """None when the compiled module's results match every run's expected ones, else why not."""

    uses_f64 = "f64" in mlir.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        vmfb = tmp / "m.vmfb"
        flags = [*compile_flags(uses_f64), *extra]
        cmd = [str(bin_dir / "iree-compile"), *flags, str(mlir), "-o", str(vmfb)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return f"compile: {r.stderr.strip()[-2000:]}"
        problems = [
            check_run(k, run, tmp, vmfb, spec["function"], bin_dir)
            for k, run in enumerate(spec["runs"])
        ]
        problems = [p for p in problems if p is not None]
    return "; ".join(problems) or None


def check_run(
    k: int, run: dict, tmp: pathlib.Path, vmfb: pathlib.Path, function: str, bin_dir: pathlib.Path
) -> str | None:
    """None when run `k` of a compiled module gives the expected results, else why not."""
    import numpy as np

    cmd = [
        str(bin_dir / "iree-run-module"),
        f"--device={DEVICE}",
        f"--module={vmfb}",
        f"--function={function}",
    ]
    for i, inp in enumerate(run["inputs"]):
        path = tmp / f"in{k}_{i}.npy"
        np.save(path, tensor(inp))
        cmd.append(f"--input=@{path}")
    outs = [tmp / f"out{k}_{i}.npy" for i in range(len(run["expected"]))]
    cmd += [f"--output=@{p}" for p in outs]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"run {k}: no result after {RUN_TIMEOUT_S} s"
    if r.returncode != 0:
        return f"run {k}: {r.stderr.strip().splitlines()[0][:300]}"
    for i, (want, path) in enumerate(zip(run["expected"], outs, strict=True)):
        got, w = np.load(path), tensor(want)
        if got.shape != w.shape or got.dtype != w.dtype:
            got_t, want_t = f"{got.dtype}{list(got.shape)}", f"{w.dtype}{list(w.shape)}"
            return f"run {k} result {i}: got {got_t}, want {want_t}"
        tol = 1e-5 if w.dtype == np.float32 else 1e-12
        if not np.allclose(got, w, rtol=tol, atol=tol, equal_nan=True):
            return f"run {k} result {i}: got {got.ravel()[:8]}, want {w.ravel()[:8]}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=pathlib.Path)
    ap.add_argument("--run", action="store_true", help="compile and run modules with a .json")
    ap.add_argument("--flag", action="append", default=[], help="an extra iree-compile flag")
    args = ap.parse_args()
    files: list[pathlib.Path] = []
    for p in args.paths:
        files += sorted(p.glob("*.mlir")) if p.is_dir() else [p] if p.suffix == ".mlir" else []
    bin_dir = pathlib.Path(sys.executable).parent
    failures = 0
    for f in files:
        problem = parse_and_verify(f.read_text())
        status = "parsed+verified"
        spec_path = f.with_suffix(".json")
        if problem is None and args.run and spec_path.exists():
            problem = run_module(f, json.loads(spec_path.read_text()), bin_dir, args.flag)
            runs = len(json.loads(spec_path.read_text())["runs"])
            status += f", compiled, {runs} run(s) match the interpreter"
        if problem is None:
            print(f"ok    {f.name}: {status}")
        else:
            failures += 1
            print(f"FAIL  {f.name}: {problem}")
    print(f"{len(files) - failures}/{len(files)} ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
