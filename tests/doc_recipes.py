"""The recipes in the docs: fenced ``sh`` blocks marked with a
``<!-- recipe: NAME -->`` line just above them, which tests run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The docs that hold recipes.
DOCS = (ROOT / "README.md", ROOT / "docs" / "deploy.md")
_RECIPE = re.compile(r"^<!-- recipe: ([a-z0-9-]+) -->\n```sh\n(.*?)^```$", re.M | re.S)
_MARK = re.compile(r"^<!-- recipe: .*-->$", re.M)


def recipes(doc: Path) -> dict[str, str]:
    """Each recipe of ``doc`` by name, its shell text as written. A mark
    not followed by a fenced ``sh`` block, or a name used twice, is an error."""
    text = doc.read_text()
    found: dict[str, str] = {}
    for match in _RECIPE.finditer(text):
        name = match.group(1)
        if name in found:
            raise ValueError(f"{doc.name}: recipe {name!r} twice")
        found[name] = match.group(2)
    marks = len(_MARK.findall(text))
    if marks != len(found):
        raise ValueError(f"{doc.name}: {marks} recipe marks, {len(found)} followed by a ```sh block")
    return found


def all_recipes() -> dict[str, str]:
    """Every recipe of :data:`DOCS` by name (names are unique across them)."""
    merged: dict[str, str] = {}
    for doc in DOCS:
        for name, text in recipes(doc).items():
            if name in merged:
                raise ValueError(f"recipe {name!r} in two docs")
            merged[name] = text
    return merged
