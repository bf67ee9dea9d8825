# `make test` and `make demo` work on a fresh machine: they create .venv, install what is
# needed, build the extension in release mode, then run.

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.deps-installed
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: test-fast all dev dev-suite test test-rust test-python vulkan-driver lint fmt demo bench clean fuzz wheel docs gallery

all: dev

$(PY):
	python3 -m venv $(VENV)

$(STAMP): requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

# The wheel users install without a Rust toolchain (`dist/`): one abi3 wheel for CPython >= 3.10,
# manylinux_2_35 (the glibc symbols the build uses: this machine kind has 2.36), checked by
# auditwheel. It reuses `make dev`'s release build.
WHEEL_TAG := manylinux_2_35
wheel: $(STAMP)
	$(VENV)/bin/maturin build --release --compatibility $(WHEEL_TAG) --out dist
	$(VENV)/bin/auditwheel show dist/gradloop-*-$(WHEEL_TAG)_x86_64.whl

# Builds the Rust extension (release) into the virtual environment.
dev: $(STAMP)
	$(VENV)/bin/maturin develop --release --quiet

# `make test` builds once, in the `suite` profile (Cargo.toml): the Rust tests, the example and
# the extension the Python tests load share every artifact. The workspace's tests resolve
# features as the extension's build does, which is what lets them share.
# On a fresh machine the Python packages download while the Rust build runs (two plain
# sub-makes, not -j: cargo keeps its own jobserver).
test: | $(PY)
	@$(MAKE) --no-print-directory $(STAMP) & setup=$$!; \
	$(MAKE) --no-print-directory test-rust; rust=$$?; \
	wait $$setup && test $$rust -eq 0
	$(MAKE) --no-print-directory test-python

# maturin builds the extension with PyO3 told about the interpreter by a config file and these
# variables. The Rust phase builds the extension's crates under the same ones, beside the tests
# (every cargo command: one without them builds PyO3 again for itself), so that maturin finds
# them built: PyO3's chain (build config, macros, pyo3, numpy, then the bindings) compiles one
# crate after another, a core idle, when maturin builds it alone. Where a maturin release
# configures PyO3 otherwise, its build compiles them again: slower, not wrong.
PY_VERSION := $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
HOST := $(shell rustc -vV | sed -n 's/^host: //p')
PYO3_CONFIG := $(abspath target/maturin/pyo3-config-$(HOST)-$(PY_VERSION)-abi3.txt)
PYO3_ENV := PYO3_CONFIG_FILE=$(PYO3_CONFIG) PYO3_ENVIRONMENT_SIGNATURE=cpython-$(PY_VERSION)-64bit \
	PYO3_PYTHON=$(abspath $(PY)) PYTHON_SYS_EXECUTABLE=$(abspath $(PY)) PYO3_BUILD_EXTENSION_MODULE=1

# What maturin writes there for the abi3 wheel (CPython >= 3.10).
$(PYO3_CONFIG):
	mkdir -p $(dir $@)
	printf 'implementation=CPython\nversion=3.10\ntarget_abi=CPython-abi3-3.10\nshared=true\nbuild_flags=\nsuppress_build_script_link_lines=false' > $@

# The executor's tests run in check mode (every compiled frame against its register program),
# then again as production runs them (compiled frames alone); `--workspace` both times, so
# that features resolve alike and the second run reuses the first one's build.
test-rust: $(PYO3_CONFIG) | $(PY)
	$(PYO3_ENV) cargo build --workspace --profile suite --quiet --lib --tests --examples
	$(PYO3_ENV) cargo test --workspace --profile suite --quiet
	$(PYO3_ENV) GRADLOOP_COMPILED_FRAMES=on cargo test --workspace --profile suite --quiet executor::
	$(PYO3_ENV) cargo run --profile suite --quiet --example loop_gradient > /dev/null

dev-suite: $(STAMP)
	$(VENV)/bin/maturin develop --profile suite --quiet

# The graph-mode suites again with graphs run on the executor with every loop a frame of tokens,
# and on the reference interpreter (the first pass runs them on the frame executor with cheap
# loops fused, as users do).
GRAPH_SUITES = tests/test_graph_mode.py tests/test_mode_agreement.py tests/test_control_flow.py \
	tests/test_autodiff_api.py tests/test_trace_core.py tests/test_op_gradients.py \
	tests/test_variables.py tests/test_errors.py

# The suite runs on TEST_JOBS processes (pytest-xdist; the Ray modules share one of them).
TEST_JOBS ?= 2
PYTEST = $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

# The three passes share one IREE compile cache, fresh for each `make test`.
TEST_CACHE := $(abspath target/test-iree-cache)

test-python: dev-suite vulkan-driver
	rm -rf $(TEST_CACHE)
	GRADLOOP_CACHE_DIR=$(TEST_CACHE) $(PYTEST)
	GRADLOOP_CACHE_DIR=$(TEST_CACHE) $(PYTEST) --graph-runner=frames $(GRAPH_SUITES)
	GRADLOOP_CACHE_DIR=$(TEST_CACHE) $(PYTEST) --graph-runner=interpreter $(GRAPH_SUITES)

# The Python tests less those marked slow (IREE compiles, hundreds of random programs): a fast
# subset to run while working; `make test` runs everything.
test-fast: dev-suite
	$(PYTEST) -m "not slow"

# Mesa's software Vulkan for the vulkan-spirv tests: installed once when missing, else a no-op.
vulkan-driver:
	@tools/ensure_vulkan.sh

lint: $(STAMP)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc -p gradloop --no-deps --quiet
	$(VENV)/bin/ruff check py tests benches examples tools
	$(VENV)/bin/ruff format --check py tests benches examples tools
	$(PY) tools/module_graph.py --check
	$(PY) tools/python_imports.py --check

# The documentation site (MkDocs, Material, mkdocstrings) into target/site; strict: a warning
# fails it. `tests/test_docs_site.py` builds it too, and `tests/test_docs_examples.py` runs
# every example on its pages.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

fmt: $(STAMP)
	cargo fmt --all
	$(VENV)/bin/ruff format py tests benches examples tools

# The differential random-program tester at scale: eager vs graph vs gl.jit, from a random seed
# (about ten seconds per program on one core, most of it IREE compiling; graph mode alone gets
# ten times as many), over FUZZ_JOBS processes (one per core by default).
FUZZ_EXAMPLES ?= 1000
fuzz: dev
	@FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) tools/fuzz.sh

demo: dev
	$(PY) examples/projectile.py

# The gallery's figures (docs/gallery.md shows them), drawn again by each example at full size.
GALLERY := docs/gallery
gallery: dev
	$(PY) -m gradloop demo --plot $(GALLERY)/projectile.png
	$(PY) examples/bouncing_ball.py --plot $(GALLERY)/bouncing_ball.png
	$(PY) examples/newton_bfgs.py --plot $(GALLERY)/newton_bfgs.png
	$(PY) examples/rnn_stop.py --plot $(GALLERY)/rnn_stop.png
	$(PY) examples/checkpointed_sim.py --plot $(GALLERY)/checkpointed_sim.png
	$(PY) examples/ensemble_ray.py --plot $(GALLERY)/ensemble_ray.png

bench: dev
	$(PY) benches/run.py
	$(PY) benches/graph_mode.py
	$(PY) benches/executor.py
	$(PY) benches/ode.py
	$(PY) benches/checkpointed.py
	$(PY) benches/compiled_mode.py
	$(PY) benches/forward_mode.py
	$(PY) benches/distributed.py
	$(PY) benches/vmap.py
	$(PY) benches/vmap_ode.py
	$(PY) benches/vmap_switch.py
	$(PY) benches/jacobians.py

clean:
	rm -rf $(VENV) target dist
