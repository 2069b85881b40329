# Every target sets up what it needs on a fresh machine (Debian, Rust, Python 3.11+).
VENV ?= .venv
PY := $(VENV)/bin/python
CORPUS ?= ../shared/corpus/pillow
FILES ?= $(CORPUS)/hopper.png $(CORPUS)/flower2.jpg $(CORPUS)/flower.webp $(CORPUS)/transparent.gif $(CORPUS)/pil_sample_cmyk.jpg

.PHONY: setup build-dev demo decode lint test bench

# System tools: cmake and nasm build the vendored libjpeg-turbo; libclang is
# what nixl-sys's bindgen needs. Then a virtualenv with the build, test, bench
# and lint tools, and NIXL's runtime (the nixl-cu12 wheel without its torch
# requirement: pixelwire loads only its C API and UCX plugin).
$(VENV)/.tools: pyproject.toml Makefile
	@command -v cmake >/dev/null && command -v nasm >/dev/null && [ -n "$$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null)" ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake nasm libclang-dev >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q "maturin>=1.9.4,<2" numpy "aiohttp>=3.10" "pillow>=12,<14" \
		"simplejpeg>=1.8" "pybase64>=1.3" "pytest>=8" "pytest-timeout>=2.3" "ruff>=0.6" "mypy>=1.11"
	$(PY) -m pip install -q --no-deps "nixl-cu12==1.5.1"
	touch $@

setup: $(VENV)/.tools

# Release build of the extension, installed editable into the virtualenv.
build-dev: setup
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q

# The main job: a frontend process publishes images over NIXL, this process
# reads them as the worker, verifies every pixel and prints a table.
demo: build-dev
	$(VENV)/bin/pixelwire demo

# Decode files and print format, shape and decode time.
decode: build-dev
	$(VENV)/bin/pixelwire decode $(FILES)

lint: setup
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy

test: build-dev
	cargo test
	$(PY) -m pytest

bench: build-dev
	cargo bench --bench decode
	$(PY) benches/decode_vs_peers.py
	$(PY) benches/fetch_decode.py
	$(PY) benches/transfer.py
