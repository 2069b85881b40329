"""No import circles between the Rust modules of ``src/``: the paths a
module names (``use`` declarations and paths written out in its code, such
as ``crate::resize::Target``), but for its ``#[cfg(test)]`` modules, never
lead back to it.

A module is a file: ``src/agent.rs`` is ``agent``, ``src/decode/mod.rs`` is
``decode``, ``src/decode/jpeg.rs`` is ``decode::jpeg``. A path is an edge to
the deepest module it names (``crate::decode::Mode`` to ``decode``,
``super::handout::ended_locked`` from ``publisher::poller`` to
``publisher::handout``). Modules are checked the way a package is layered:
an edge between two modules counts between the children of the module
that holds them both, so ``decode::jpeg`` using ``resize`` is ``decode``
using ``resize`` at the top, and ``publisher::poller`` using
``publisher::handout`` is a circle only if ``handout`` leads back to
``poller``. A module and the modules inside it are one unit (``mod.rs``
declares its children and they use what it holds): no edge between them
counts. What Rust resolves without a path (a method defined in another
module's ``impl`` block) is not an edge."""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import circles

SRC = Path(__file__).resolve().parent.parent / "src"

# Circles known and kept, each as the sorted list `import_circles` reports,
# with why it is kept. None: the tree has no circle.
ALLOWED: list[list[str]] = []

Module = tuple[str, ...]

_RAW_STRING = re.compile(r'b?r(#*)"')
_CHAR = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def modules(root: Path) -> dict[Module, Path]:
    """Module path -> file, for every ``.rs`` file under ``root`` (the
    crate root, ``lib.rs``, is the empty path)."""
    found: dict[Module, Path] = {}
    for path in sorted(root.rglob("*.rs")):
        parts = [*path.relative_to(root).parent.parts, path.stem]
        if parts[-1] == "mod" or parts == ["lib"]:
            parts.pop()
        found[tuple(parts)] = path
    return found


def code_of(text: str) -> str:
    """``text`` with comments, string and character literals blanked out
    and every ``#[cfg(test)]`` module cut, so that what is left is code."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif (c == "r" or text.startswith("br", i)) and (raw := _RAW_STRING.match(text, i)):
            end = text.find('"' + raw.group(1), raw.end())
            i = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (char := _CHAR.match(text, i)):
            i = char.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return _cut_test_modules("".join(out))


def _cut_test_modules(code: str) -> str:
    while match := re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
        depth, i = 1, match.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        code = code[: match.start()] + code[i:]
    return code


def _use_paths(tree: str) -> list[str]:
    """The paths a ``use`` tree names: ``crate::{a, b::{c, D}}`` gives
    ``crate::a``, ``crate::b::c`` and ``crate::b::D``."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, _, rest = tree.partition("{")
    inner = rest[: rest.rfind("}")]
    items, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    return [head + path for item in items if item for path in _use_paths(item)]


def referenced(name: Module, path: Path, known: dict[Module, Path]) -> set[Module]:
    """The modules that ``name`` (at ``path``) names a path into."""
    code = code_of(path.read_text())
    # `use` trees written with `as` keep the path before it.
    code = re.sub(r"\s+as\s+\w+", "", code)
    paths = [p for tree in re.findall(r"\buse\s+([^;]+);", code) for p in _use_paths(tree)]
    paths += re.findall(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*\w+)+)", code)
    # A file's own module is `name`; `self` and `super` count from it.
    edges = set()
    for written in paths:
        segments = [s for s in re.split(r"\s*::\s*", written) if s]
        if segments[0] == "crate":
            target, rest = [], segments[1:]
        elif segments[0] in ("self", "super"):
            target, rest = list(name), segments
            while rest and rest[0] in ("self", "super"):
                if rest.pop(0) == "super":
                    target = target[:-1]
        else:
            continue  # another crate, or a child module of `name` (the same unit)
        full = [*target, *(s for s in rest if s != "*")]
        while tuple(full) not in known:
            full.pop()
        edges.add(tuple(full))
    return edges


def import_circles(root: Path) -> list[list[str]]:
    """Each set of modules that name one another in a circle, at any level
    of the module tree (module paths joined with ``::``)."""
    known = modules(root)
    graphs: dict[Module, dict[str, set[str]]] = {}
    for name, path in known.items():
        for target in referenced(name, path, known):
            common = 0
            while common < min(len(name), len(target)) and name[common] == target[common]:
                common += 1
            if common == min(len(name), len(target)):
                continue  # one holds the other
            graph = graphs.setdefault(name[:common], {})
            graph.setdefault("::".join(name[: common + 1]), set()).add("::".join(target[: common + 1]))
    return sorted(circle for graph in graphs.values() for circle in circles(graph))


def test_the_crate_has_no_import_circles() -> None:
    assert import_circles(SRC) == sorted(ALLOWED)


def test_a_planted_circle_is_found(tmp_path: Path) -> None:
    """The check would see a circle: two modules naming each other (one by
    a `use` tree, one by a path in its code), two files of one module
    naming each other, and a file deep in one module naming a module that
    names that module back; not through comments, strings, characters,
    `#[cfg(test)]` modules, a parent and its child, or another crate."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    files = {
        "lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub mod e;\n",
        "a.rs": "use crate::{b::{self, Thing as Other}, e};\npub fn g() {}\n",
        "b.rs": "pub struct Thing;\npub fn f() {\n    crate :: a :: g();\n}\n",
        "c/mod.rs": "mod x;\nmod y;\nuse self::x::X;\npub use y::*;\n",
        "c/x.rs": "use super::y::Y;\nuse crate::d::*;\npub struct X;\n",
        "c/y.rs": "pub struct Y;\npub fn h() -> super::x::X {\n    super::X\n}\n",
        "d.rs": "use crate::c::Y;\n",
        "e.rs": (
            "// use crate::a::g;\n/* crate::a::g() */\nconst Q: char = '\"';\n"
            'const S: &str = "crate::a::g";\nconst R: &str = r#"crate::a"#;\n'
            "use std::collections::HashMap;\nuse rayon::prelude::*;\n"
            "#[cfg(test)]\nmod tests {\n    use crate::a::g;\n    fn t() { let _ = '}'; }\n}\n"
        ),
    }
    for name, text in files.items():
        (src / name).write_text(text)
    assert import_circles(src) == [["a", "b"], ["c", "d"], ["c::x", "c::y"]]
