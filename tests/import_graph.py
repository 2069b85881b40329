"""What the import-circle tests (`test_imports.py` for the package,
`test_rust_imports.py` for `src/`) share: the circles of a graph."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Each set of nodes that lead to one another through the edges of
    ``graph`` (node -> the nodes it leads to): its strongly connected
    components of more than one node (Tarjan's), each sorted, in order."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            connect(node)
    return sorted(found)
