"""How IREE 3.13 keeps a tensor stack that a data-dependent loop pushes onto: the evidence
behind the stack representation of `rust/core/src/mlir/stacks.rs`.

Usage: python benches/iree_loop_stacks.py [--repeats R]

One hand-written module per representation, `while i < n: h = tanh(h); push h` (h: 64 float32s),
then one value read back; run on `local-sync` at n = 1000, 4000 and 16000:

- `buffer`: a `tensor<? x 64 x f32>` carried by `scf.while`, pushed with `tensor.insert_slice`
  (what the emitter writes; `maximum_iterations` makes its capacity static, same result);
- `buffer-static`: the same with a static `tensor<N x 64 x f32>`;
- `list`: a `!util.list<?>` of `hal.buffer_view`s (`hal.tensor.export` + `util.list.set`).

Flat ns per push means O(1) per push; growing with n means IREE copies the buffer every trip.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from iree import compiler
from iree import runtime as rt

SIZES = (1000, 4000, 16000)

LOOP = """module {{
  func.func @f(%x: tensor<64xf32>, %n: tensor<i64>) -> tensor<64xf32> {{
    {init}
    %nn = tensor.extract %n[] : tensor<i64>
    %z = arith.constant 0 : i64
    %r:3 = scf.while (%i = %z, %h = %x, %s = %s0) : (i64, tensor<64xf32>, {ty})
        -> (i64, tensor<64xf32>, {ty}) {{
      %c = arith.cmpi slt, %i, %nn : i64
      scf.condition(%c) %i, %h, %s : i64, tensor<64xf32>, {ty}
    }} do {{
    ^bb0(%i2: i64, %h2: tensor<64xf32>, %s2: {ty}):
      %t = stablehlo.tanh %h2 : tensor<64xf32>
      %k = arith.index_cast %i2 : i64 to index
      {push}
      %one = arith.constant 1 : i64
      %i3 = arith.addi %i2, %one : i64
      scf.yield %i3, %t, %s3 : i64, tensor<64xf32>, {ty}
    }}
    %c0 = arith.constant 0 : index
    {read}
    %o = stablehlo.add %first, %r#1 : tensor<64xf32>
    return %o : tensor<64xf32>
  }}
}}"""


def module(kind: str, n: int) -> str:
    if kind == "list":
        ty = "!util.list<?>"
        init = f"%cap = arith.constant {n} : index\n    %s0 = util.list.create %cap : {ty}"
        push = (
            "%v = hal.tensor.export %t : tensor<64xf32> -> !hal.buffer_view\n"
            "      %one_i = arith.constant 1 : index\n"
            "      %k1 = arith.addi %k, %one_i : index\n"
            f"      util.list.resize %s2, %k1 : {ty}\n"
            f"      util.list.set %s2[%k], %v : !hal.buffer_view -> {ty}\n"
            "      %s3 = util.optimization_barrier %s2 : !util.list<?>"
        )
        read = (
            f"%g = util.list.get %r#2[%c0] : {ty} -> !hal.buffer_view\n"
            "    %first = hal.tensor.import %g : !hal.buffer_view -> tensor<64xf32>"
        )
        return LOOP.format(init=init, ty=ty, push=push, read=read)
    static = kind == "buffer-static"
    ty = f"tensor<{n}x64xf32>" if static else "tensor<?x64xf32>"
    init = (
        f"%s0 = tensor.empty() : {ty}"
        if static
        else f"%cap = arith.constant {n} : index\n    %s0 = tensor.empty(%cap) : {ty}"
    )
    push = f"%s3 = tensor.insert_slice %t into %s2[%k, 0][1, 64][1, 1] : tensor<64xf32> into {ty}"
    read = f"%first = tensor.extract_slice %r#2[%c0, 0][1, 64][1, 1] : {ty} to tensor<64xf32>"
    return LOOP.format(init=init, ty=ty, push=push, read=read)


def ns_per_push(kind: str, n: int, repeats: int) -> float:
    flags = ["--iree-hal-target-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]
    vmfb = compiler.compile_str(module(kind, n), extra_args=flags)
    f = rt.load_vm_flatbuffer(vmfb, driver="local-sync").f
    x, count = np.full(64, 0.5, np.float32), np.array(n, np.int64)
    f(x, count)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(x, count)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e9 / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'stack':<15}" + "".join(f"{f'n = {n}':>14}" for n in SIZES) + "   (ns per push)")
    for kind in ("buffer", "buffer-static", "list"):
        row = [ns_per_push(kind, n, args.repeats) for n in SIZES]
        print(f"{kind:<15}" + "".join(f"{v:>14,.0f}" for v in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
