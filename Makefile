# Every target sets up what it needs on a fresh machine (Debian, Rust, Python 3.11+).
VENV ?= .venv
PY := $(VENV)/bin/python
CORPUS ?= ../shared/corpus/pillow
FILES ?= $(CORPUS)/hopper.png $(CORPUS)/flower2.jpg $(CORPUS)/flower.webp $(CORPUS)/transparent.gif $(CORPUS)/pil_sample_cmyk.jpg

.PHONY: setup build-dev decode lint test bench

# System tools for the vendored libjpeg-turbo build, then a virtualenv with
# the build, test, bench and lint tools.
$(VENV)/.tools: pyproject.toml
	@command -v cmake >/dev/null && command -v nasm >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake nasm >/dev/null; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q "maturin>=1.9.4,<2" numpy "pillow>=12,<14" "simplejpeg>=1.8" \
		"pytest>=8" "pytest-timeout>=2.3" "ruff>=0.6" "mypy>=1.11"
	touch $@

setup: $(VENV)/.tools

# Release build of the extension, installed editable into the virtualenv.
build-dev: setup
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q

# The main job: decode files and print format, shape and decode time.
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
