"""The product's import graph (issues 21 and 36), read from the source with ast, held to the layers that
docs/architecture.md declares (its "Layers" table is read here: the document and this test cannot part).

- No import runs back up a layer: a module of ``sandbox_rt`` imports modules of its own layer and of the
  layers below only. Every import counts: at module level, inside a function, under ``if TYPE_CHECKING``
  (a late import is still a dependency; a type-only one is inverted with a small protocol instead).
- No import circle spans two folders (a circle inside one folder is that folder's business), and none in
  ``sandbox_rt`` runs at module level at all (Python would depend on the import order).
- The PVE API test server (``pve_testserver``) imports nothing of ``sandbox_rt``, nor the other way round.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sandbox_rt"
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOTS = ("sandbox_rt", "pve_testserver")

Graph = dict[str, set[str]]


def _layers() -> list[tuple[str, tuple[str, ...]]]:
    """docs/architecture.md's "Layers" table, lowest first: (layer, its top-level modules and folders).
    A row is ``| n | layer | `a.py`, `b/` | what it holds |``."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    layers = [(cells[2].strip(), tuple(re.findall(r"`([\w.]+?)(?:\.py|/)?`", cells[3]))) for cells in rows]
    numbers = [int(cells[1]) for cells in rows]
    assert numbers == list(range(1, len(rows) + 1)), f"the layers are numbered 1, 2, ...: {numbers}"
    return layers


LAYERS = _layers()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module_level: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: every one, or only those that run when it is imported (at
    module level, under a plain ``if`` or ``try``, not under ``if TYPE_CHECKING``)."""
    if not module_level:
        return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    found: list[ast.Import | ast.ImportFrom] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and not _is_type_checking(node):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            body.extend(node.body)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
    return found


def _edges(*, module_level: bool = False, roots: tuple[str, ...] = ("sandbox_rt",)) -> Graph:
    """Module -> the modules of ``roots`` it imports. Importing ``a.b.c`` also runs package ``a.b``
    (its ``__init__``): an edge too, unless the importer is inside ``a.b`` (then it is running already)."""
    modules = {_module_name(p): p for root in roots for p in (REPO / root).rglob("*.py")}
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text()), module_level):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                # "from . import x" / "from .pkg import mod": the submodule when it is one
                subs = [f"{target}.{alias.name}" for alias in node.names]
                targets = [sub if sub in modules else target for sub in subs]
            for target in targets:
                while target and target not in modules:  # "import a.b.c" of a name, not a module
                    target = target.rpartition(".")[0]
                graph[name].add(target)
                parts = target.split(".")
                for depth in range(2, len(parts)):  # the packages on the way, but the importer's own
                    package = ".".join(parts[:depth])
                    if not name.startswith(f"{package}."):
                        graph[name].add(package)
    return {src: {dst for dst in dsts if dst in modules and dst != src} for src, dsts in graph.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, (_name, members) in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} is in no layer: add it to the Layers table of docs/architecture.md")


def _upward(graph: Graph) -> list[str]:
    return [
        f"{src} ({LAYERS[_layer(src)][0]}) -> {dst} ({LAYERS[_layer(dst)][0]})"
        for src, targets in sorted(graph.items())
        for dst in sorted(targets)
        if _layer(dst) > _layer(src)
    ]


def _find_cycle(graph: Graph) -> list[str]:
    """A cycle of ``graph`` (its modules in order, the first again at the end), or []."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def _circles(graph: Graph) -> list[set[str]]:
    """The import circles of ``graph``: its strongly connected components of two modules or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _folder(module: str) -> str:
    path = REPO / module.replace(".", "/")
    return str(path.relative_to(REPO)) if path.is_dir() else str(path.parent.relative_to(REPO))


def _circles_across_folders(graph: Graph) -> list[list[str]]:
    return [sorted(c) for c in _circles(graph) if len({_folder(m) for m in c}) > 1]


# -- the layers ------------------------------------------------------------------------------------------
def test_the_layers_name_what_exists() -> None:
    """Every name in the table is a module or folder of sandbox_rt, once (a stale row fails here)."""
    names = [name for _layer_name, members in LAYERS for name in members]
    assert len(names) == len(set(names)), names
    for name in names:
        if name != "__init__":
            assert (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name).is_dir(), name


def test_every_module_has_a_layer() -> None:
    for module in _edges():
        _layer(module)


def test_no_import_runs_back_up_a_layer() -> None:
    assert _upward(_edges()) == []


def test_an_upward_import_is_found() -> None:
    graph = _edges()
    graph["sandbox_rt.config"].add("sandbox_rt.templates")  # as its late import of the registry did
    (found,) = _upward(graph)
    assert found.startswith("sandbox_rt.config (") and " -> sandbox_rt.templates (" in found


# -- circles ---------------------------------------------------------------------------------------------
def test_no_import_circle_spans_two_folders() -> None:
    assert _circles_across_folders(_edges(roots=ROOTS)) == []


def test_a_circle_across_folders_is_found() -> None:
    graph = _edges(roots=ROOTS)
    graph["sandbox_rt.templates.build"].add("sandbox_rt.manager")  # the Manager it built through before
    assert _circles_across_folders(graph) == [
        sorted({"sandbox_rt.manager", "sandbox_rt.templates", "sandbox_rt.templates.build"})
    ]
    # a circle inside one folder is that folder's own (pve_testserver: the dispatcher and its routes)
    assert any(_folder(m) == "pve_testserver" for c in _circles(graph) for m in c)


def test_no_import_cycle_at_module_level() -> None:
    assert _find_cycle(_edges(module_level=True)) == []


def test_a_cycle_is_found() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    graph = _edges(module_level=True)
    graph["sandbox_rt.models"].add("sandbox_rt.manager")  # models -> manager -> models
    assert "sandbox_rt.models" in _find_cycle(graph)


# -- the test server and the runtime ---------------------------------------------------------------------
def test_the_test_server_and_the_runtime_import_nothing_of_each_other() -> None:
    graph = _edges(roots=ROOTS)
    crossing = sorted(
        f"{src} -> {dst}"
        for src, dsts in graph.items()
        for dst in dsts
        if src.split(".")[0] != dst.split(".")[0]
    )
    assert crossing == []


# -- the reader ------------------------------------------------------------------------------------------
def test_the_graph_is_read() -> None:
    """The reader sees the edges it must (else the checks above would pass on nothing)."""
    graph = _edges()
    assert "sandbox_rt.backends.lxc.backend" in graph["sandbox_rt.backends.lxc"]
    assert "sandbox_rt.backends.lxc.netstate" in graph["sandbox_rt.backends.lxc.backend"]
    assert "sandbox_rt.config" in graph["sandbox_rt.backends.lxc.netstate"]
    assert "sandbox_rt.manager" in graph["sandbox_rt.cli"]
    assert "sandbox_rt.templates.build" in graph["sandbox_rt.manager"]  # inside a function
    assert "sandbox_rt.templates" in graph["sandbox_rt.manager"]  # under TYPE_CHECKING
    assert "sandbox_rt.templates.build" not in _edges(module_level=True)["sandbox_rt.manager"]
    assert "sandbox_rt.backends.lxc" in graph["sandbox_rt.templates.lxc_store"]  # the package it runs
    servers = _edges(roots=ROOTS)
    assert "pve_testserver.core" in servers["pve_testserver.api_lxc"]
    assert len(LAYERS) >= 5 and sum(len(members) for _name, members in LAYERS) >= 30


def test_the_http_transport_imports_only_the_core() -> None:
    """The transport (its service, one connection's protocol, the slot table) knows no API."""
    graph = _edges()
    transport = {"sandbox_rt.web.transport", "sandbox_rt.web.connection", "sandbox_rt.web.slots"}
    assert {"sandbox_rt.web.connection", "sandbox_rt.web.limits"} <= graph["sandbox_rt.web.transport"]
    for module in sorted(transport):
        assert graph[module] <= transport | {"sandbox_rt.errors", "sandbox_rt.web.limits"}, module
