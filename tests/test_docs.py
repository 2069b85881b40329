"""The docs cannot drift from the code: every path they name exists, every
``PIXELWIRE_*`` variable they name is one the code knows, and the package
reads those variables in one place (``python/pixelwire/config.py``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top-level folders of the repository: a backticked span starting with one
# of them is a path into it.
TOP = ("src/", "python/", "tests/", "benches/", "docs/", "fuzz/", ".ci/", "crates/")
# Where the build, the fuzzers and the benchmarks write (git-ignored): paths
# the docs name as outputs.
OUTPUTS = ("target/", "dist/", ".bench/", "fuzz/artifacts/", "fuzz/target/")
# Variables read by harnesses outside the package (tests, fuzzing, the Makefile).
CODE = ("python", "src", "tests", "fuzz", "benches", "Makefile", ".ci")


def _tracked(pattern: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed]


def _docs() -> list[Path]:
    return [path for path in _tracked("*.md") if path.exists()]


def _exists(doc: Path, path: str) -> bool:
    """Whether ``path`` names a file or folder from the repository's root,
    or from the doc's own folder or one above it."""
    if (ROOT / path).exists():
        return True
    for base in doc.parents:
        if (base / path).exists():
            return True
        if base == ROOT:
            break
    return False


@pytest.mark.parametrize("doc", _docs(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for span in re.findall(r"`([^`\s]+)`", line):
            path = span.rstrip(".,:;")
            if not path.startswith(TOP) or path.startswith(OUTPUTS) or re.search(r"[*<>{}$]", path):
                continue
            if not _exists(doc, path):
                missing.append(f"line {number}: {span}")
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_pixelwire_variable_a_doc_names_is_known_to_the_code() -> None:
    code = "\n".join(
        path.read_text(errors="replace")
        for pattern in CODE
        for path in _tracked(pattern)
        if path.is_file() and path.suffix in ("", ".py", ".rs", ".sh", ".toml")
    )
    known = set(re.findall(r"PIXELWIRE_[A-Z0-9_]+", code))
    unknown = {
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in _docs()
        for name in re.findall(r"PIXELWIRE_[A-Z0-9_]+", doc.read_text())
        if name not in known and not name.endswith("_")
    }
    assert unknown == set(), f"variables no code reads: {sorted(unknown)}"


def test_the_package_reads_pixelwire_variables_only_in_config() -> None:
    readers = re.compile(r"(environ|getenv|env_int|env_float|env_flag)\b[^\n]*PIXELWIRE_")
    outside = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _tracked("python/pixelwire/*.py")
        if path.name != "config.py" or path.parent.name != "pixelwire"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if readers.search(line)
    ]
    assert outside == [], f"PIXELWIRE_* read outside python/pixelwire/config.py: {outside}"
