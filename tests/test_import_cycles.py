"""No import cycles in Airlock's own packages: a module that needs another's names imports it,
and nothing imports it back, not even from inside a function (a lazy import hides a cycle from
Python, not from a reader). `from package import submodule` depends on the submodule alone."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "policies_app", "sessions")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    def ours(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in known.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {ours(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    edges.add(submodule if submodule in known else ours(node.module))
        graph[name] = edges - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_airlock_s_packages_import_each_other_without_a_cycle():
    graph = import_graph(modules())
    assert graph["sessions.events"] <= {"sessions.models", "sessions.layer"}  # it knows nothing of runners
    assert graph["sessions.layer"] == set()
    assert cycles(graph) == []


def test_a_cycle_held_together_by_a_lazy_import_is_found(tmp_path):
    (tmp_path / "x.py").write_text("def later():\n    from pkg import y  # lazy: Python would not mind\n")
    (tmp_path / "y.py").write_text("import pkg.x\n")
    (tmp_path / "z.py").write_text("from pkg.y import name\n")
    graph = import_graph({"pkg.x": tmp_path / "x.py", "pkg.y": tmp_path / "y.py", "pkg.z": tmp_path / "z.py"})
    assert graph == {"pkg.x": {"pkg.y"}, "pkg.y": {"pkg.x"}, "pkg.z": {"pkg.y"}}
    assert cycles(graph) == [["pkg.x", "pkg.y"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
