"""One create contract (issue 36): the create options are declared once (sandbox_rt.options) and
every front door derives from that declaration. A test-local option added to the declaration shows
up at every door; and the measure of the issue, how many front-door files name each option, is
computed here (run this file with ``python`` for the table; ``--root DIR`` counts another tree)."""

from __future__ import annotations

import argparse
import ast
import asyncio
import re
import sys
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest

from sandbox_rt import options as declaration
from sandbox_rt.aio import AsyncManager
from sandbox_rt.cli import _parser, create_options
from sandbox_rt.errors import ConfigError
from sandbox_rt.models import SandboxSpec
from sandbox_rt.options import (
    CreateOptions,
    Option,
    SpecOptions,
    all_options,
    door_options,
    read_declaration,
    take,
)
from sandbox_rt.remote import calls
from sandbox_rt.validation import check_create
from sandbox_rt.web.schemas import create_request_model

PACKAGE = Path(__file__).resolve().parents[2] / "sandbox_rt"
# the front doors' files (the Python API's create and its check, the remote clients, the HTTP API
# and its OpenSandbox dialect, the MCP server, the CLI, the door policy and protocols); the
# declaration itself (options.py) is not one
FRONT_DOORS = (
    "manager.py", "aio.py", "validation.py", "policy.py", "protocols.py", "http_api.py", "http_openapi.py",
    "cli.py", "cli_volumes.py", "cli_template.py", "remote/*.py", "web/*.py", "web/opensandbox/*.py",
    "api/*.py",
)  # fmt: skip
# Where each option is still named in code beside its declaration: the runtime that implements it,
# the one adapter that maps it (the OpenSandbox dialect), and the status answers that report it (MCP's
# view of a status). Pinned for the options whose name is theirs alone; the others' names are also
# another concept's (the sandbox's hostname, the internet and egress routes, relabel, extend's ttl_s,
# the root user, the templates and volumes routes), which a count by name cannot tell apart.
_DIALECT = "web/opensandbox/mapping.py"  # resourceLimits, image, snapshotId, timeout, ... -> options
_STATUS = {"api/mcp_answers.py", "web/opensandbox/execd_metrics.py"}  # a status's limits, shown
ADAPTERS = {
    "cpus": {_DIALECT, *_STATUS},
    "memory_mb": {_DIALECT, *_STATUS},
    "disk_gb": {_DIALECT, *_STATUS},
    "pids_max": set(),
    "detached": {"cli.py"},  # run: owned by the command; create: lives by its TTL
    "from_snapshot": {"manager.py", _DIALECT},  # the runtime forks
    "net_mbps": set(),
    "disk_mbps": set(),
    "disk_iops": set(),
    "node": {"manager.py", "validation.py"},  # the runtime places; check_node_name(node)
}


def _code_strings(tree: ast.AST) -> Iterator[str]:
    """Every identifier and string constant of the code (comments and docstrings left out; prose in
    a string names an option only as text)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword | ast.arg) and node.arg:
            yield node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


def mentions(root: Path, names: Sequence[str]) -> dict[str, dict[str, set[str]]]:
    """option -> {"code": files naming it in code (an identifier, an attribute, a keyword or a string
    that is the name: ``disk_iops=``, ``spec.disk_iops``, ``"disk_iops"``), "text": files naming it
    anywhere (grep -w, as itself or as its CLI flag ``disk-iops``)}, over the front-door files
    under ``root`` (a ``sandbox_rt`` directory)."""
    files = sorted({p for pattern in FRONT_DOORS for p in root.glob(pattern)})
    out: dict[str, dict[str, set[str]]] = {n: {"code": set(), "text": set()} for n in names}
    for path in files:
        rel = str(path.relative_to(root))
        text = path.read_text()
        words = list(_code_strings(ast.parse(text)))
        for name in names:
            word = re.compile(rf"(?<![\w-])(?:{name}|{name.replace('_', '-')})(?![\w-])")
            if word.search(text):
                out[name]["text"].add(rel)
            if name in words:
                out[name]["code"].add(rel)
    return out


# -- the measure ---------------------------------------------------------------------------------------
def test_a_create_option_is_named_by_its_declaration_and_at_most_one_adapter() -> None:
    found = mentions(PACKAGE, [o.name for o in all_options()])
    for name, allowed in ADAPTERS.items():
        assert found[name]["code"] <= allowed, (name, found[name]["code"] - allowed)


# -- a new option reaches every door -------------------------------------------------------------------
class _Extended(CreateOptions, total=False):
    """The declaration with one more option (made for this test)."""

    gpus: Annotated[
        int | None,
        Option(
            "integer",
            "GPUs to pass through",
            doc="GPUs passed through to the sandbox.",
            minimum=0,
            maximum=8,
            spec=False,
            doors=frozenset({"python", "http", "cli", "mcp"}),
            metavar="N",
        ),
    ]


@pytest.fixture
def extended(monkeypatch: pytest.MonkeyPatch) -> Option:
    monkeypatch.setattr(declaration, "OPTIONS", read_declaration(_Extended))
    return declaration.option("gpus")


def test_a_new_option_reaches_the_python_doors_and_the_one_check(extended: Option) -> None:
    assert check_create({"gpus": 2}, host_cpus=2)[1] == {"gpus": 2}
    with pytest.raises(ConfigError, match="gpus=9 must be between 0 and 8"):
        check_create({"gpus": 9}, host_cpus=2)
    assert calls.create(gpus=2).json == {"gpus": 2}  # type: ignore[call-arg]  # the remote clients
    made: list[dict[str, Any]] = []

    class Sync:  # what AsyncManager drives
        def create(self, **options: Any) -> Any:
            made.append(options)
            return object()

    async def main() -> None:
        mgr = AsyncManager(Sync(), max_workers=1)  # type: ignore[arg-type]
        await mgr.create(gpus=1)  # type: ignore[call-arg]
        await mgr.aclose()

    asyncio.run(main())
    assert made == [{"gpus": 1}]
    assert take({"gpus": 1}, "http") == {"gpus": 1, "detached": True}
    with pytest.raises(ConfigError, match="gpus= cannot be set through this door"):
        take({"gpus": 1}, "opensandbox")


def test_a_new_option_reaches_the_http_schema(extended: Option) -> None:
    model = create_request_model(door_options("http"))
    prop = model.model_json_schema()["properties"]["gpus"]
    assert prop == {
        "default": None,
        "description": "GPUs passed through to the sandbox.",
        "maximum": 8,
        "minimum": 0,
        "title": "Gpus",
        "type": ["integer", "null"],
    }
    assert model.model_validate({"gpus": 3}).gpus == 3  # type: ignore[attr-defined]


def test_a_new_option_reaches_the_cli(extended: Option) -> None:
    args = _parser().parse_args(["create", "--gpus", "2"])
    assert create_options(args)["gpus"] == 2
    assert create_options(_parser().parse_args(["run", "--", "true"]))["gpus"] is None


def test_a_new_option_reaches_the_mcp_tool(extended: Option) -> None:
    from sandbox_rt.mcp.server import SandboxMcp
    from tests.unit import test_mcp_server as mcp_fakes

    mgr = mcp_fakes.FakeManager()
    srv = SandboxMcp(mgr)  # type: ignore[arg-type]

    async def main() -> Any:
        async with mcp_fakes.Client(srv.server, mode="legacy") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            made = await client.call_tool("create_sandbox", {"gpus": 2})
            return tools["create_sandbox"].input_schema["properties"]["gpus"], made

    try:
        prop, made = asyncio.run(main())
    finally:
        srv.close(10)
    assert prop["description"] == "GPUs to pass through" and prop["default"] is None
    assert not made.is_error, mcp_fakes.text(made)
    assert mgr.created[-1]["gpus"] == 2


# -- the declaration itself ----------------------------------------------------------------------------
def test_the_declaration_is_the_spec_and_the_python_signature() -> None:
    spec_options = [o.name for o in all_options() if o.spec]
    assert set(spec_options) == set(SandboxSpec.__dataclass_fields__)
    assert set(spec_options) == set(typing.get_type_hints(SpecOptions))
    assert {o.name for o in all_options()} == set(typing.get_type_hints(CreateOptions))
    for opt in all_options():
        assert opt.help and "python" in opt.doors and "http" in opt.doors, opt.name  # every option, both APIs
        for other in opt.excludes:
            declaration.option(other)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the measure: per option, the front-door files that name it in code (and anywhere)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", type=Path, default=PACKAGE, help="a sandbox_rt directory to count")
    args = parser.parse_args(argv)
    names = [o.name for o in all_options()]
    found = mentions(args.root, names)
    print(f"{'option':14} {'code':>4} {'text':>4}  files naming it in code")
    for name in names:
        code, text = found[name]["code"], found[name]["text"]
        print(f"{name:14} {len(code):4} {len(text):4}  {', '.join(sorted(code))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
