"""The built wheel is complete on its own: installed into a fresh virtualenv
by the README's own install commands, run as written (`pip install` of the
wheel and of the lean NIXL runtime, `pixelwire --version`), its
command-line tool decodes corpus files and folders, runs the demo over NIXL
and reports its version. `make test` builds the wheel and passes it as
PIXELWIRE_WHEEL; plain pytest uses the newest wheel in dist/ and skips when
there is none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reference import CORPUS

ROOT = Path(__file__).resolve().parent.parent
DECODE_FILES = ["flower2.jpg", "hopper.png", "flower.webp", "transparent.gif"]


def readme_install_commands() -> list[str]:
    """The shell commands of the README's first code block under
    "## Install", in order, their comments taken off."""
    section = (ROOT / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for line in section.splitlines():
        if line.startswith("    "):
            commands.append(line.split(" #", 1)[0].strip())
        elif commands and line.strip():
            break  # the block is over
    return commands


def _wheel() -> Path | None:
    given = os.environ.get("PIXELWIRE_WHEEL")
    if given:
        path = Path(given).resolve()
        assert path.is_file(), f"PIXELWIRE_WHEEL={given} is not a file"
        return path
    wheels = sorted((ROOT / "dist").glob("pixelwire-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


@dataclass
class FreshVenv:
    wheel: Path
    bin: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, timeout: float = 240) -> str:
        done = self.run(*args, timeout=timeout)
        assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshVenv]:
    wheel = _wheel()
    if wheel is None:
        pytest.skip("no wheel in dist/: `make wheel` builds one (`make test` builds it and runs this test)")
    root = tmp_path_factory.mktemp("fresh-venv")
    # Nothing of this checkout or of the test virtualenv may leak in: no
    # PYTHONPATH, no NIXL library override, a working directory outside the repository.
    leaks = ("PYTHONPATH", "PIXELWIRE_NIXL_LIB", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in leaks}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    fresh = FreshVenv(wheel=wheel, bin=root / "venv" / "bin", env=env, cwd=root)
    # The README's install block as a user types it, with the venv's pip
    # and pixelwire first on PATH; `make wheel` made the wheel under test.
    shell_env = {**env, "PATH": f"{fresh.bin}{os.pathsep}{env.get('PATH', '')}"}
    commands = [c for c in readme_install_commands() if not c.startswith("make wheel")]
    assert commands and commands[0].startswith("pip install dist/pixelwire-"), commands
    for command in commands:
        line = command.replace("dist/pixelwire-*.whl", str(wheel))
        done = subprocess.run(
            ["bash", "-c", line], cwd=root, env=shell_env, capture_output=True, text=True, timeout=600
        )
        output = f"{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, f"README: {command!r} exited {done.returncode}:\n{output}"
    print(f"fresh venv from the README's install block ({commands}): {time.monotonic() - started:.1f} s")
    yield fresh


def test_wheel_installs_into_its_own_site_packages(venv: FreshVenv) -> None:
    """The package, its stub and the extension come from the fresh venv, and
    the vLLM plug-in's entry point is registered by the wheel's metadata."""
    out = venv.ok(
        str(venv.bin / "python"),
        "-c",
        "import importlib.metadata as m, pathlib, pixelwire;"
        "print(pathlib.Path(pixelwire.__file__).parent);"
        "print(sorted(e.value for e in m.entry_points(group='vllm.general_plugins')))",
    )
    package_dir, plugins = out.splitlines()
    assert Path(package_dir).is_relative_to(venv.bin.parent), package_dir
    for name in ("_native.abi3.so", "_native.pyi", "py.typed"):
        assert (Path(package_dir) / name).is_file(), name
    assert plugins == "['pixelwire.vllm:register']"


def test_wheel_version_matches_its_file_name(venv: FreshVenv) -> None:
    """`pixelwire --version` reads the package metadata; the extension's
    __version__ (the crate's) and the wheel's file name agree with it."""
    version = venv.wheel.name.split("-")[1]
    assert venv.ok(str(venv.bin / "pixelwire"), "--version").strip() == f"pixelwire {version}"
    native = venv.ok(str(venv.bin / "python"), "-c", "import pixelwire; print(pixelwire.__version__)")
    assert native.strip() == version


def test_wheel_decodes_corpus_files(venv: FreshVenv) -> None:
    """`pixelwire decode` on JPEG (the statically linked libjpeg-turbo), PNG,
    WebP and GIF files prints a line per file with its shape."""
    files = [CORPUS / name for name in DECODE_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        pytest.skip(f"corpus files missing: {missing}")
    out = venv.ok(str(venv.bin / "pixelwire"), "decode", *map(str, files))
    header, *lines = out.strip().splitlines()
    assert "shape" in header, out
    assert len(lines) == len(files), out
    for name, line in zip(DECODE_FILES, lines, strict=True):
        assert line.split()[0] == name and re.search(r"\b\d+x\d+x3\b", line), line


def test_wheel_decodes_a_folder(venv: FreshVenv, tmp_path: Path) -> None:
    """`pixelwire decode DIR` takes the images in a folder, as `demo` does."""
    for name in DECODE_FILES[:2]:
        if not (CORPUS / name).is_file():
            pytest.skip(f"corpus file missing: {name}")
        (tmp_path / name).write_bytes((CORPUS / name).read_bytes())
    out = venv.ok(str(venv.bin / "pixelwire"), "decode", str(tmp_path))
    assert sorted(line.split()[0] for line in out.strip().splitlines()[1:]) == sorted(DECODE_FILES[:2]), out


def test_wheel_runs_the_demo_over_nixl(venv: FreshVenv) -> None:
    """`pixelwire demo --per-size 2`: a publisher process publishes images over
    NIXL (loaded from the nixl-cu12 wheel) and this venv's reader verifies every pixel."""
    done = venv.run(str(venv.bin / "pixelwire"), "demo", "--per-size", "2", timeout=280)
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "verified 10 images pixel for pixel" in done.stdout, done.stdout
    assert "failures: 0" in done.stdout, done.stdout
    # The first read's connection set-up is reported on its own, in no size's row.
    assert "warm-up: first image read in" in done.stdout, done.stdout
    print(done.stdout)
