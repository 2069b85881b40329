"""The docs cannot drift from the code: every path they name exists, every
``PIXELWIRE_*`` variable they name is one the code knows, and the package
reads those variables in one place (``python/pixelwire/config.py``);
docs/configuration.md lists exactly the options of every command and the
variables config.py reads, docs/metrics.md exactly the metrics both sides
register; the README stays a page; every recipe is run by the deploy test."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import doc_recipes
import pytest
from prometheus_client import CollectorRegistry

from pixelwire import cli
from pixelwire.frontend.app import Frontend
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.handshake import INFO_LABELS
from pixelwire.metrics import worker_metrics

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


# -- docs/configuration.md: every option and variable, none invented ----------

CONFIGURATION = ROOT / "docs" / "configuration.md"
# Each command with options, as `pixelwire ...` names it.
COMMANDS = (("frontend",), ("decode",), ("demo",), ("bench", "transfer"), ("bench", "serve"))


def _subparser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = cli.build_parser(list(words))
    for word in words:
        (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[word]
    return parser


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for flag in action.option_strings
    }


def _section(doc: Path, heading: str) -> str:
    """The text under ``heading`` (a whole heading line), up to the next
    heading of its level or above."""
    text = doc.read_text()
    level = heading.split(" ", 1)[0]
    assert f"\n{heading}\n" in text, f"{doc.relative_to(ROOT)} has no {heading!r}"
    body = text.split(f"\n{heading}\n", 1)[1]
    ends = [i for i in (body.find(f"\n{'#' * n} ") for n in range(1, len(level) + 1)) if i >= 0]
    return body[: min(ends)] if ends else body


def _first_column(section: str) -> set[str]:
    """The backticked names in the first cell of each table row."""
    cells = [
        line.split("|")[1] for line in section.splitlines() if line.startswith("| ") and "---" not in line
    ]
    return {name for cell in cells for name in re.findall(r"`([^`]+)`", cell)}


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_configuration_lists_exactly_each_commands_options(words: tuple[str, ...]) -> None:
    section = _section(CONFIGURATION, f"## `pixelwire {' '.join(words)}`")
    documented = {name for name in _first_column(section) if name.startswith("--")}
    parsed = _options(_subparser(words))
    assert parsed - documented == set(), f"options docs/configuration.md omits: {sorted(parsed - documented)}"
    assert documented - parsed == set(), f"options it invents: {sorted(documented - parsed)}"


def test_configuration_lists_exactly_the_variables_config_reads() -> None:
    source = (ROOT / "python" / "pixelwire" / "config.py").read_text()
    read = set(re.findall(r"(?:environ\.get|getenv|env_[a-z]+)\(\s*\"(PIXELWIRE_[A-Z0-9_]+)\"", source))
    assert len(read) > 20, "the pattern no longer finds how config.py reads variables"
    documented = {
        name
        for name in _first_column(_section(CONFIGURATION, "## Environment variables"))
        if name.startswith("PIXELWIRE_")
    }
    assert read - documented == set(), f"variables docs/configuration.md omits: {sorted(read - documented)}"
    assert documented - read == set(), f"variables it invents: {sorted(documented - read)}"


# -- docs/metrics.md: every metric of both registries, none invented ----------


def _exposed(registry: CollectorRegistry) -> set[str]:
    """The names a scrape shows for each metric: a counter's with ``_total``."""
    return {m.name + "_total" if m.type == "counter" else m.name for m in registry.collect()}


def test_metrics_doc_lists_exactly_the_registered_metrics() -> None:
    frontend = Frontend(FrontendConfig(upstream="http://127.0.0.1:9"))
    worker = CollectorRegistry()
    worker_metrics(
        worker,
        {label: "x" for label in INFO_LABELS},
        pool_bytes_in_use=lambda: 0.0,
        pool_bytes_capacity=lambda: 0.0,
        frontends=lambda: 0.0,
        cache_stats=dict,
    )
    registered = _exposed(frontend.registry) | _exposed(worker)
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = {
        name for name in _first_column(text) if name.startswith(("pixelwire_frontend_", "pixelwire_worker_"))
    }
    assert registered - documented == set(), (
        f"metrics docs/metrics.md omits: {sorted(registered - documented)}"
    )
    assert documented - registered == set(), f"metrics it invents: {sorted(documented - registered)}"


# -- the README and the recipes ----------------------------------------------

README_MAX_LINES = 300


def test_the_readme_is_a_page_not_a_manual() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; reference belongs in docs/"


def test_every_recipe_mark_holds_a_shell_block_and_the_deploy_test_runs_them_all() -> None:
    names = set(doc_recipes.all_recipes())
    run = (ROOT / "tests" / "e2e" / "test_deploy_recipes.py").read_text()
    assert {"one-host", "haproxy"} <= names
    assert {name for name in names if f'"{name}"' not in run} == set(), "recipes no test runs"
