"""One benchmark on two builds of the extension, in one run: before and after a change.

Usage: python benches/builds.py BEFORE.so AFTER.so [--rounds N] -- benches/executor.py [args]

Each build gets its own copy of the package (`py/gradloop` with that `_core` in it); the
benchmark runs in a fresh process per build, alternating (before, after, before, ...) for N
rounds (3 by default), so that the machine's drift falls on both alike. Each round's output
is printed under its build's name; compare the medians the benchmark prints, round by round.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package(so: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    """A copy of the package whose extension is `so`; returns the folder to put on the path."""
    shutil.copytree(ROOT / "py" / "gradloop", into / "gradloop", ignore=_no_extension)
    shutil.copy2(so, into / "gradloop" / "_core.abi3.so")
    return into


def _no_extension(_folder: str, names: list[str]) -> list[str]:
    extension = [n for n in names if n.startswith("_core.") and n.endswith(".so")]
    return [*extension, "__pycache__"]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv[:split])
    bench = argv[split + 1 :]
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            name: package(so.resolve(), pathlib.Path(tmp) / name)
            for name, so in (("before", args.before), ("after", args.after))
        }
        for k in range(args.rounds):
            for name, path in builds.items():
                env = {**os.environ, "PYTHONPATH": str(path)}
                print(f"=== round {k + 1}, {name} ({getattr(args, name)})", flush=True)
                run = subprocess.run([sys.executable, *bench], env=env, cwd=ROOT, check=False)
                if run.returncode != 0:
                    return run.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
