"""No module of the package is over 600 lines: a file holds one concern,
and one that grows past this splits along its seams (#45)."""

from __future__ import annotations

from pathlib import Path

import pixelwire

PACKAGE = Path(pixelwire.__file__).parent
LIMIT = 600


def over_the_limit(root: Path, limit: int = LIMIT) -> list[str]:
    """Each Python module under ``root`` longer than ``limit`` lines, with its length."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_package_module_is_over_600_lines() -> None:
    assert over_the_limit(PACKAGE) == [], f"split these along their seams (at most {LIMIT} lines)"


def test_the_check_finds_a_planted_long_module(tmp_path: Path) -> None:
    package = tmp_path / "planted"
    (package / "inner").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * LIMIT)
    (package / "inner" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    assert over_the_limit(package) == [f"planted/inner/long.py: {LIMIT + 1} lines"]
