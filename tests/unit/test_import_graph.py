"""The product's import graph (issue 21): no cycle between modules and no upward arrow (a lower layer
never imports a higher one). Read from the source with ast: module-level imports only (an import
inside a function or under ``if TYPE_CHECKING`` is a deliberate late binding, not an edge)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sandbox_rt"

# lowest first: a module may import its own layer and lower ones only
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("errors", "caps", "limits", "models", "validation", "config", "filelock", "ipam", "logs",
              "volumes", "process_limits", "policy", "options", "error_names")),
    ("engines", ("ssh", "backends")),
    ("runtime", ("execution", "files", "download", "pty", "forward", "commands", "background", "sandbox",
                 "pool", "manager", "terminal", "templates", "protocols")),
    ("front doors", ("aio", "remote", "web", "http_openapi", "http_api", "api", "cli", "cli_volumes",
                     "cli_template", "__main__", "__init__")),
]  # fmt: skip


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _edges() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        body = list(ast.parse(path.read_text()).body)
        while body:
            node = body.pop(0)
            if isinstance(node, ast.If) and not _is_type_checking(node):
                body.extend(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                body.extend(node.body)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name.startswith("sandbox_rt")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                if not target.startswith("sandbox_rt"):
                    continue
                # "from . import x" / "from .pkg import mod": the submodule when it is one
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    graph[name].add(sub if sub in modules else target)
    return {k: {v for v in vs if v in modules and v != k} for k, vs in graph.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, (_name, members) in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} is in no layer of this test: add it to LAYERS")


def test_every_module_has_a_layer() -> None:
    for module in _edges():
        _layer(module)


def _find_cycle(graph: dict[str, set[str]]) -> list[str]:
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


def test_no_import_cycle() -> None:
    assert _find_cycle(_edges()) == []


def test_a_cycle_is_found() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    graph = _edges()
    graph["sandbox_rt.models"].add("sandbox_rt.manager")  # models -> manager -> models
    assert "sandbox_rt.models" in _find_cycle(graph)


def test_no_upward_arrow() -> None:
    upward = [
        f"{src} ({LAYERS[_layer(src)][0]}) -> {dst} ({LAYERS[_layer(dst)][0]})"
        for src, targets in sorted(_edges().items())
        for dst in sorted(targets)
        if _layer(dst) > _layer(src) and src != "sandbox_rt"  # the package root re-exports the API
    ]
    assert upward == []


def test_the_graph_is_read() -> None:
    """The reader sees the edges it must (else the two checks above would pass on nothing)."""
    graph = _edges()
    assert "sandbox_rt.backends.lxc.backend" in graph["sandbox_rt.backends.lxc"]
    assert "sandbox_rt.backends.lxc.netstate" in graph["sandbox_rt.backends.lxc.backend"]
    assert "sandbox_rt.config" in graph["sandbox_rt.backends.lxc.netstate"]
    assert "sandbox_rt.manager" in graph["sandbox_rt.cli"]


def test_the_http_transport_imports_only_the_core() -> None:
    """The transport (its service, one connection's protocol, the slot table) knows no API."""
    graph = _edges()
    transport = {"sandbox_rt.web.transport", "sandbox_rt.web.connection", "sandbox_rt.web.slots"}
    assert {"sandbox_rt.web.connection", "sandbox_rt.limits"} <= graph["sandbox_rt.web.transport"]
    for module in sorted(transport):
        assert graph[module] <= transport | {"sandbox_rt.errors", "sandbox_rt.limits"}, module
