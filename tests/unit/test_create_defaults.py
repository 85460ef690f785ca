"""Create defaults live in one place (sandbox_rt.models, issue 21): every front door offers the same
ones, so a change there reaches the Manager, make_spec, the CLI, the HTTP API's OpenAPI document,
the remote and async clients and the MCP server together."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from sandbox_rt import Manager
from sandbox_rt.aio import AsyncManager
from sandbox_rt.cli import _parser
from sandbox_rt.models import SandboxSpec
from sandbox_rt.remote import AsyncClient, Client
from sandbox_rt.validation import make_spec
from sandbox_rt.web.app import openapi_document

FIELDS = ("cpus", "memory_mb", "disk_gb", "pids_max")
SPEC = SandboxSpec()


@pytest.mark.parametrize(
    "create", [Manager.create, make_spec, Client.create, AsyncClient.create, AsyncManager.create]
)
def test_python_front_doors_default_to_the_spec(create: Callable[..., Any]) -> None:
    params = inspect.signature(create).parameters
    assert {f: params[f].default for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert params["root"].default is False and params["internet"].default is False


def test_the_cli_defaults_to_the_spec() -> None:
    args = _parser().parse_args(["create"])
    assert (args.cpus, args.memory, args.disk) == (SPEC.cpus, SPEC.memory_mb, SPEC.disk_gb)


def test_the_openapi_document_defaults_to_the_spec() -> None:
    props = openapi_document()["components"]["schemas"]["CreateSandboxRequest"]["properties"]
    assert {f: props[f]["default"] for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert props["root"]["default"] is False


def test_make_spec_with_no_arguments_has_the_default_limits() -> None:
    # (the caps differ on purpose: a stored spec without them means "no cap", a new one the host's)
    made = make_spec(host_cpus=4)
    assert {f: getattr(made, f) for f in FIELDS} == {f: getattr(SPEC, f) for f in FIELDS}
    assert (made.internet, made.root, made.egress) == (False, False, ())
