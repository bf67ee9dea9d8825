"""Compiled mode on the other targets. `vulkan-spirv` modules run on Mesa's software Vulkan
(lavapipe, installed by `make test`) through IREE's `vulkan` driver and must agree with eager
mode in float32; `cuda` modules are compiled (running them needs an NVIDIA GPU)."""

from __future__ import annotations

import gc
import io
import os
import time
import zipfile

import numpy as np
import pytest

import gradloop as gl
from gradloop import _iree_build

#: IREE compiles (or hundreds of programs): `make test-fast` leaves these out.
pytestmark = pytest.mark.slow

pytest.importorskip("iree.compiler", reason="compiled mode needs iree-base-compiler")

F32 = {"rtol": 2e-5, "atol": 2e-6}


def f32(*values: float) -> gl.Tensor:
    return gl.tensor(np.array(values, dtype=np.float32))


def leaves(x: object) -> list[np.ndarray]:
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in leaves(item)]
    return [np.asarray(x)]


# ---- programs (float32) -------------------------------------------------------------------------


def branches(x):
    y = gl.cond(x.sum() > 0, lambda: gl.sin(x) * x, lambda: gl.exp(x))
    return y * 2.0 - 1.0


def switch(x, k):
    return gl.switch_case(k, [lambda: x * 2.0, lambda: gl.tanh(x), lambda: gl.cos(x) + x])


def data_dependent_loop(x, limit):
    """`while sum(v) < limit: v = v * 1.25 + 0.5; i += 1`, returning `(i, v)`."""
    return gl.while_loop(lambda i, v: v.sum() < limit, lambda i, v: (i + 1, v * 1.25 + 0.5), (0, x))


def loop_loss(x, n):
    body = lambda i, v: (i + 1, v * 0.9 + gl.sin(v) * 0.1)  # noqa: E731
    return gl.while_loop(lambda i, v: i < n, body, (0, x))[1].sum()


def looped_branches(x):
    def body(i, v):
        return i + 1, gl.cond(v.sum() > 1.0, lambda: gl.sin(v) * v, lambda: v * 1.5 + 0.2)

    return gl.while_loop(lambda i, v: i < 5, body, (0, x))[1].sum()


def masked(x, keep):
    # A bool input of a length that is not a multiple of 4 (see compiled.py: 8-bit storage).
    return gl.where(keep, x * 3.0, -x)


PROGRAMS = [
    ("cond-true", branches, (f32(0.3, 0.7, -0.1),)),
    ("cond-false", branches, (f32(-0.3, -0.7, 0.1),)),
    ("switch-0", switch, (f32(0.3, -0.4), gl.tensor(0))),
    ("switch-1", switch, (f32(0.3, -0.4), gl.tensor(1))),
    ("switch-out-of-range", switch, (f32(0.3, -0.4), gl.tensor(9))),
    ("while", data_dependent_loop, (f32(0.1, 0.2), gl.tensor(40.0))),
    ("while-no-trip", data_dependent_loop, (f32(30.0, 20.0), gl.tensor(40.0))),
    ("loop-gradient", gl.value_and_grad(loop_loss), (f32(0.3, -0.8), gl.tensor(25))),
    ("loop-gradient-0", gl.value_and_grad(loop_loss), (f32(0.3, -0.8), gl.tensor(0))),
    ("cond-in-loop-gradient", gl.grad(looped_branches), (f32(0.4, 0.3),)),
    ("second-derivative", gl.grad(lambda x: gl.grad(loop_loss)(x, 3).sum()), (f32(0.3, -0.2),)),
    ("bool-input", masked, (f32(1.0, -2.0, 3.0), gl.tensor([True, False, True]))),
]


# ---- vulkan-spirv on Mesa's software Vulkan ------------------------------------------------------


@pytest.fixture(scope="module")
def vulkan() -> None:
    """Fails (never skips) when no Vulkan device can be created: `make test` installs one."""
    from gradloop import _runtime

    try:
        _runtime.device("vulkan")
    except Exception as e:  # the runtime raises plain RuntimeError/ValueError here
        pytest.fail(
            "no Vulkan device: the vulkan-spirv tests run on Mesa's software Vulkan. Install it "
            "with `make test` or tools/ensure_vulkan.sh (Debian: apt-get install "
            f"mesa-vulkan-drivers libvulkan1). IREE said: {e}"
        )


@pytest.mark.parametrize(("name", "fn", "args"), PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_vulkan_agrees_with_eager_mode(vulkan, name, fn, args) -> None:
    eager = leaves(fn(*args))
    got = leaves(gl.jit(fn, target="vulkan-spirv")(*args))
    for e, c in zip(eager, got, strict=True):
        assert e.dtype == c.dtype and e.shape == c.shape, name
        np.testing.assert_allclose(c, e, **F32, err_msg=name)


def test_vulkan_threads_variables(vulkan) -> None:
    counter = gl.Variable(np.int32(0))
    w = gl.Variable(np.array([0.5, 1.0], dtype=np.float32))

    def step(x):
        def body(v):
            counter.assign_add(1)
            return v * w + 0.25

        v = gl.while_loop(lambda v: v.sum() < 10.0, body, x)
        w.assign(w * 1.5)
        return v

    f = gl.jit(step, target="vulkan-spirv")
    x = f32(1.0, 1.0)
    want_w, trips, v = np.array([0.5, 1.0], np.float32), 0, None
    for _ in range(2):
        v = np.array([1.0, 1.0], np.float32)
        while v.sum() < 10.0:
            v, trips = v * want_w + np.float32(0.25), trips + 1
        want_w = want_w * np.float32(1.5)
        np.testing.assert_allclose(np.asarray(f(x)), v, **F32)
    assert int(counter.numpy()) == trips
    np.testing.assert_allclose(w.numpy(), want_w, **F32)


def test_a_vulkan_device_no_function_uses_is_released(vulkan) -> None:
    # On Mesa's software Vulkan, IREE's device polls its semaphores on two threads at full
    # speed for as long as it lives: two cores taken from everything else in the process.
    from gradloop import _runtime

    f = gl.jit(lambda x: gl.sin(x) * 2.0, target="vulkan-spirv")
    np.testing.assert_allclose(np.asarray(f(f32(0.5))), 2.0 * np.sin(np.float32(0.5)), **F32)
    assert "vulkan" in _runtime._configs
    del f
    gc.collect()
    assert "vulkan" not in _runtime._configs
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    assert time.process_time() - cpu < 0.5 * (time.monotonic() - wall)  # the process idles


def test_a_lost_device_is_replaced_and_the_call_run_again(monkeypatch) -> None:
    # Simulated on the CPU driver: Mesa's software Vulkan loses the device now and then.
    from gradloop import _runtime

    f = gl.jit(lambda x: gl.sin(x) * 2.0)
    x = f32(0.5, 1.0)
    np.testing.assert_allclose(np.asarray(f(x)), 2.0 * np.sin([0.5, 1.0]), rtol=1e-6)
    device = _runtime.device("local-sync")  # a small module runs on the calling thread
    real_run, failures = _runtime.Function._run, []

    def flaky(self, inputs, copy=True):
        if len(failures) < 2:
            failures.append(1)
            raise RuntimeError("queue.c: DATA_LOSS; [vkWaitSemaphores] VK_ERROR_DEVICE_LOST")
        return real_run(self, inputs, copy)

    monkeypatch.setattr(_runtime.Function, "_run", flaky)
    np.testing.assert_allclose(np.asarray(f(x)), 2.0 * np.sin([0.5, 1.0]), rtol=1e-6)
    assert failures == [1, 1] and _runtime.device("local-sync") is not device

    # A device lost on every attempt, in every form: a gl.errors exception.
    def lost(self, inputs, copy=True):
        raise RuntimeError("queue.c: DATA_LOSS; [vkWaitSemaphores] VK_ERROR_DEVICE_LOST")

    monkeypatch.setattr(_runtime.Function, "_run", lost)
    with (
        pytest.warns(gl.errors.FormWarning, match="DEVICE_LOST"),
        pytest.raises(gl.errors.ExecutionError, match="DEVICE_LOST"),
    ):
        f(x)


def test_vulkan_refuses_float64_with_a_clear_error(vulkan) -> None:
    x = gl.tensor(np.array([1.0, 2.0]))
    with pytest.raises(gl.errors.CompileError, match=r"vulkan-spirv has no float64.*gl\.cast"):
        gl.jit(branches, target="vulkan-spirv")(x)
    with pytest.raises(gl.errors.CompileError, match="float64"):
        _iree_build.compile_mlir(gl.to_mlir(branches, x), "vulkan-spirv")


# ---- cuda: compiled, not run ---------------------------------------------------------------------

CUDA_PROGRAMS = [p for p in PROGRAMS if p[0] in ("cond-true", "switch-1", "while", "loop-gradient")]


def assert_vmfb(vmfb: bytes) -> None:
    # A `.vmfb` is a zip holding the VM module (a size-prefixed FlatBuffer with IREE's file
    # identifier) and one file per executable: here a CUDA (PTX) one.
    with zipfile.ZipFile(io.BytesIO(vmfb)) as archive:
        names = archive.namelist()
        assert archive.read("module.fb")[8:12] == b"IREE", names
    assert any("cuda_nvptx_fb" in n for n in names), names


@pytest.mark.parametrize(("name", "fn", "args"), CUDA_PROGRAMS, ids=[p[0] for p in CUDA_PROGRAMS])
def test_cuda_compiles(name, fn, args) -> None:
    assert_vmfb(_iree_build.compile_mlir(gl.to_mlir(fn, *args), "cuda"))


def test_cuda_compiles_float64_and_second_derivatives() -> None:
    x = gl.tensor(np.array([0.3, -0.2]))
    second = gl.grad(lambda x: gl.grad(loop_loss)(x, gl.tensor(3)).sum())
    mlir = gl.to_mlir(second, x)
    assert "xf64>" in mlir
    assert_vmfb(_iree_build.compile_mlir(mlir, "cuda"))


def test_cuda_export_writes_the_module(tmp_path) -> None:
    path = gl.export(
        loop_loss, f32(0.3, -0.8), gl.tensor(4), path=tmp_path / "loss.vmfb", target="cuda"
    )
    assert_vmfb(path.read_bytes())
    assert "scf.while" in path.with_suffix(".mlir").read_text()


def test_driver_flags_are_known_to_the_runtime() -> None:
    """The runtime flags `gl.jit` sets before creating a driver (CUDA's command buffers as
    graphs) are read only where that driver runs, which CI lacks: a flag this runtime does not
    know would fail the first call there, so each one is parsed here."""
    from iree import runtime

    from gradloop import _runtime

    assert _runtime.DRIVER_FLAGS["cuda"]
    for flags in _runtime.DRIVER_FLAGS.values():
        runtime.flags.parse_flags(*flags)
    with pytest.raises(ValueError, match="not recognized"):
        runtime.flags.parse_flags("--cuda_use_streamz=false")


def test_gpu_check_bundle_runs_on_the_cpu(tmp_path) -> None:
    """`tools/cuda_check.py` (the GPU check) itself: its bundle, built for `llvm-cpu` and run by
    its script on `local-task` with `iree-run-module`, agrees with eager mode."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    runtime = pathlib.Path(sys.executable).parent
    if not (runtime / "iree-run-module").exists():
        pytest.fail("iree-run-module is not installed (iree-base-runtime provides it)")
    tool = [sys.executable, str(root / "tools" / "cuda_check.py")]
    bundle, results = tmp_path / "bundle", tmp_path / "results"
    subprocess.run(
        [*tool, "prepare", str(bundle), "--target", "llvm-cpu", "--no-bench"], check=True
    )
    env = {**os.environ, "DEVICE": "local-task"}
    run = subprocess.run(
        ["bash", str(bundle / "run.sh"), str(runtime), str(results)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rc=1" not in run.stdout, run.stdout
    compare = subprocess.run(
        [*tool, "compare", str(bundle), str(results)], capture_output=True, text=True
    )
    assert compare.returncode == 0, compare.stdout
    assert compare.stdout.count(" ok") == len(PROGRAMS) + 4, compare.stdout
