"""Create defaults live in one place (issue 21; since issue 36 the declaration of the create options,
sandbox_rt.options, which quotes sandbox_rt.models): every front door offers the same ones, so a
change there reaches the Manager, make_spec, the CLI, the HTTP API's OpenAPI document, the remote and
async clients and the MCP server together."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Unpack

import pytest

from sandbox_rt import Manager
from sandbox_rt.aio import AsyncManager
from sandbox_rt.cli import _parser
from sandbox_rt.models import SandboxSpec
from sandbox_rt.options import CreateOptions, SpecOptions, option
from sandbox_rt.remote import AsyncClient, Client, calls
from sandbox_rt.validation import make_spec
from sandbox_rt.web.app import openapi_document

FIELDS = ("cpus", "memory_mb", "disk_gb", "pids_max")
SPEC = SandboxSpec()


@pytest.mark.parametrize(
    ("create", "declared"),
    [
        (Manager.create, CreateOptions),
        (AsyncManager.create, CreateOptions),
        (Client.create, CreateOptions),
        (AsyncClient.create, CreateOptions),
        (calls.create, CreateOptions),
        (make_spec, SpecOptions),
    ],
)
def test_python_front_doors_take_the_declared_options(create: Callable[..., Any], declared: type) -> None:
    hints = typing.get_type_hints(create)
    unpacked = [h for h in hints.values() if typing.get_origin(h) is Unpack]
    assert unpacked == [Unpack[declared]]  # type: ignore[valid-type]


def test_the_declaration_defaults_to_the_spec() -> None:
    assert {f: option(f).default for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert option("root").default is False and option("internet").default is False


def test_the_cli_defaults_to_the_spec() -> None:
    args = _parser().parse_args(["create"])
    assert {f: getattr(args, f) for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}


def test_the_openapi_document_defaults_to_the_spec() -> None:
    props = openapi_document()["components"]["schemas"]["CreateSandboxRequest"]["properties"]
    assert {f: props[f]["default"] for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert props["root"]["default"] is False


def test_make_spec_with_no_arguments_has_the_default_limits() -> None:
    # (the caps differ on purpose: a stored spec without them means "no cap", a new one the host's)
    made = make_spec(host_cpus=4)
    assert {f: getattr(made, f) for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert (made.internet, made.root, made.egress) == (False, False, ())
