"""No import circles between the Rust modules of ``src/``: the paths a
module names (``use`` declarations and paths written out in its code, such
as ``crate::resize::Target``), but for its ``#[cfg(test)]`` modules, never
lead back to it.

A module is a file: ``src/agent.rs`` is ``agent``, ``src/decode/mod.rs`` is
``decode``, ``src/decode/jpeg.rs`` is ``decode::jpeg``. A path is an edge to
the deepest module it names (``crate::decode::Mode`` to ``decode``,
``super::handout::ended_locked`` from ``publisher::poller`` to
``publisher::handout``), or, where that module has the item by a ``use``
(a re-export), to the item's own module (``crate::publisher::cancelled``
to ``publisher::publish``). Modules are checked the way a package is layered:
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


def _absolute(name: Module, written: str, known: dict[Module, Path]) -> list[str] | None:
    """The path ``written`` in module ``name`` from the crate root (its
    segments), or None where it leads into another crate."""
    segments = [s for s in re.split(r"\s*::\s*", written) if s and s != "*"]
    if not segments:
        return None
    if segments[0] == "crate":
        return segments[1:]
    if segments[0] in ("self", "super"):
        base = list(name)
        while segments and segments[0] in ("self", "super"):
            if segments.pop(0) == "super":
                base = base[:-1]
        return [*base, *segments]
    if (*name, segments[0]) in known:  # a child module, by its own name
        return [*name, *segments]
    return None


def named(name: Module, path: Path, known: dict[Module, Path]) -> tuple[list[list[str]], list[list[str]]]:
    """The paths (from the crate root) that ``name`` (at ``path``) names,
    and those of them its ``use`` declarations bring in: through ``name``,
    those are the paths of what they name (``pub use`` for every module,
    a plain ``use`` for the modules inside ``name``)."""
    code = code_of(path.read_text())
    # `use` trees written with `as` keep the path before it.
    code = re.sub(r"\s+as\s+\w+", "", code)
    used = [
        _absolute(name, p, known) for tree in re.findall(r"\buse\s+([^;]+);", code) for p in _use_paths(tree)
    ]
    inline = re.findall(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*\w+)+)", code)
    imports = [p for p in used if p]
    return [*imports, *(p for p in (_absolute(name, w, known) for w in inline) if p is not None)], imports


def _module_of(
    full: list[str], known: dict[Module, Path], reexports: dict[Module, dict[str, list[str]]]
) -> Module:
    """The module that holds what ``full`` names: the deepest module on
    the path, or, for an item a module re-exports, the item's own module."""
    for _ in range(len(known)):
        depth = len(full)
        while tuple(full[:depth]) not in known:
            depth -= 1
        module = tuple(full[:depth])
        source = reexports.get(module, {}).get(full[depth]) if depth < len(full) else None
        if source is None or source == full[: depth + 1]:
            return module
        full = [*source, *full[depth + 1 :]]
    return module


def import_circles(root: Path) -> list[list[str]]:
    """Each set of modules that name one another in a circle, at any level
    of the module tree (module paths joined with ``::``)."""
    known = modules(root)
    paths = {name: named(name, path, known) for name, path in known.items()}
    reexports = {name: {p[-1]: p for p in imports} for name, (_, imports) in paths.items()}
    graphs: dict[Module, dict[str, set[str]]] = {}
    for name, (written, _) in paths.items():
        for target in {_module_of(full, known, reexports) for full in written}:
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
    naming each other (one through the item their module re-exports), and
    a file deep in one module naming a module that
    names that module back; not through comments, strings, characters,
    `#[cfg(test)]` modules, a parent and its child, or another crate."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    files = {
        "lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub mod d;\npub mod e;\n",
        "a.rs": "use crate::{b::{self, Thing as Other}, e};\npub fn g() {}\n",
        "b.rs": "pub struct Thing;\npub fn f() {\n    crate :: a :: g();\n}\n",
        "c/mod.rs": "mod x;\nmod y;\npub use self::x::X;\npub use y::*;\n",
        "c/x.rs": "use super::y::Y;\nuse crate::d::*;\npub struct X;\n",
        "c/y.rs": "pub struct Y;\npub fn h() -> super::X {\n    super::X\n}\n",
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
