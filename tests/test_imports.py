"""No import circles in the package: a module's imports (at any depth of
its code, but for those under ``if TYPE_CHECKING:``) never lead back to
it. Importing a submodule by name is an edge to that submodule; importing
another name from a package is an edge to the package's ``__init__``. The
parent packages Python initialises on the way are not edges (every module
would otherwise sit in a circle with its package)."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import circles

import pixelwire

PACKAGE = Path(pixelwire.__file__).parent


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at ``root``
    (native extensions included: they import nothing of the package)."""
    found = {}
    for path in [*root.rglob("*.py"), *root.rglob("*.so")]:
        parts = [root.name, *path.relative_to(root).parent.parts, path.name.split(".")[0]]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in known else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    edges = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def import_circles(root: Path) -> list[list[str]]:
    """Each set of the package's modules that import one another in a circle."""
    known = modules(root)
    graph = {
        name: imported(name, path, known) if path.suffix == ".py" else set() for name, path in known.items()
    }
    return circles(graph)


def test_the_package_has_no_import_circles() -> None:
    assert import_circles(PACKAGE) == []


def test_a_planted_circle_is_found(tmp_path: Path) -> None:
    """The check would see a circle: two modules importing each other (one
    of them inside a function), and a package importing a name from a
    module that imports the package; not one under TYPE_CHECKING."""
    package = tmp_path / "planted"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from planted.c import VALUE\n")
    (package / "a.py").write_text("from planted import b\n")
    (package / "b.py").write_text("def late():\n    from .a import x\n")
    (package / "c.py").write_text("from planted import VERSION\nVALUE = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted.sub import e\n"
    )
    (package / "sub" / "e.py").write_text("from planted.sub import d\n")
    assert sorted(import_circles(package)) == [["planted", "planted.c"], ["planted.a", "planted.b"]]
