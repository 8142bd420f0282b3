# The one entry point for people and CI (README: `make test`, `make tour`).
# Everything is built from scratch into a virtual environment under .venv.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export CARGO_TERM_COLOR ?= never
export PYTHONUNBUFFERED := 1

.PHONY: venv develop test test-rust check-aarch64 test-other-cpus test-python wheel-check tour bench wheel clean

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "maturin==1.16.0" "numpy>=2.0,<2.6" "pytest>=8" "hypothesis>=6" "scipy>=1.11" \
	    "tqdm>=4.60" "ml_dtypes>=0.4" "matplotlib>=3.7" \
	    "onnxruntime>=1.20" "onnx>=1.15" "onnx-ir>=0.1" "gguf>=0.19" \
	    "nvidia-cuda-nvrtc==13.*" "nvidia-cuda-runtime==13.*" "cuda-bindings==13.*"
	touch $@

venv: $(VENV)/.stamp

# Builds the extension with the `ci` profile (the same profile `cargo test` uses below, so the
# dependencies compile once) and installs the package editable into the venv.
develop: venv
	$(VENV)/bin/maturin develop --locked --profile ci

test-rust: check-aarch64
	cargo test --locked --profile ci
	cargo bench --locked --no-run

# The Arm64 build (NEON kernels) compile-checked on every run; its Rust tests run under
# qemu-user where qemu-aarch64-static and an aarch64 linker are installed (Debian:
# `apt-get install qemu-user-static gcc-aarch64-linux-gnu`), and are skipped, saying so, where not.
AARCH64 := aarch64-unknown-linux-gnu
check-aarch64:
	@if ! command -v rustup >/dev/null; then \
	    echo "check-aarch64: no rustup to add the $(AARCH64) target: skipped"; \
	else \
	    set -e; rustup target add $(AARCH64); \
	    cargo check --locked --profile ci --target $(AARCH64) -p maleki-msgemm -p maleki-py --tests; \
	    if command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null; then \
	        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu" \
	        cargo test --locked --profile ci --target $(AARCH64) -p maleki-msgemm; \
	        echo "check-aarch64: again on a CPU without the dot-product extension (the i16 tables instead of sdot)"; \
	        QEMU_CPU=cortex-a72 CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu" \
	        cargo test --locked --profile ci --target $(AARCH64) -p maleki-msgemm --test dense --test simd_kernels; \
	    else \
	        echo "check-aarch64: no qemu-aarch64-static / aarch64-linux-gnu-gcc: the Arm64 tests are skipped (compile-checked only)"; \
	    fi; \
	fi

# The msgemm tests on CPUs other than this one, under qemu-user where it is installed (with
# the Arm64 tools above): the Python tests on a CPU without AVX-512 (Haswell: AVX2 + F16C, what
# most laptops and Zen 2/3 run), whose `auto` calls take the AVX2 kernels and their depths (the
# Rust tests already run every AVX2 kernel by name, natively; under emulation they would take
# 7 minutes); and on Arm64 (.ci/aarch64_python.sh: Debian's aarch64 CPython and our aarch64
# wheel).
QEMU_AVX2 := qemu-x86_64-static -cpu Haswell-v4
test-other-cpus: develop
	@if command -v qemu-x86_64-static >/dev/null; then \
	    set -e; echo "test-other-cpus: msgemm on an emulated AVX2 CPU (no AVX-512)"; \
	    $(QEMU_AVX2) $(PY) -c "import maleki_rs.msgemm as mg; b = mg.available_backends(); print(b); assert 'avx512' not in b"; \
	    $(QEMU_AVX2) $(PY) -m pytest -q -p no:cacheprovider tests/msgemm; \
	else \
	    echo "test-other-cpus: no qemu-x86_64-static: the AVX2-only run is skipped"; \
	fi
	bash .ci/aarch64_python.sh $(PY) $(VENV)/bin/maturin

test-python: develop
	$(PY) -m pytest -q tests

# The abi3 release wheel installs into a fresh venv and runs `maleki tour` there.
wheel-check: venv
	rm -rf dist $(VENV)-wheel
	$(VENV)/bin/maturin build --release --locked -o dist
	$(PYTHON) -m venv $(VENV)-wheel
	$(VENV)-wheel/bin/python -m pip install -q dist/*.whl
	cd /tmp && $(CURDIR)/$(VENV)-wheel/bin/maleki --version && $(CURDIR)/$(VENV)-wheel/bin/maleki tour
	cd /tmp && $(CURDIR)/$(VENV)-wheel/bin/python -c "from maleki_rs._gpu.loader import cuda_root, source_path; \
	    import maleki_rs, pathlib; r = cuda_root(); assert pathlib.Path(maleki_rs.__file__).parent in r.parents, r; \
	    print('packaged CUDA sources:', sorted(str(p.relative_to(r)) for p in r.rglob('*.cu')))"

# pytest runs last so that its summary closes the log.
test: test-rust wheel-check test-other-cpus test-python

tour:
	$(PYTHON) -m pip install . && maleki tour

bench: develop
	cargo bench --locked
	$(PY) -m pip install -q ".[bench]"
	$(PY) benches/run_all.py

wheel: venv
	$(VENV)/bin/maturin build --release --locked -o dist

clean:
	rm -rf $(VENV) $(VENV)-wheel dist target python/maleki_rs/_cuda python/maleki_rs/*.so
