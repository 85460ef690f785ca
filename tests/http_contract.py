"""The HTTP API's published OpenAPI document as a contract (issue 18 item 4), proven by a property-based
fuzzer: Schemathesis (4.x) reads ``GET /openapi.json`` from the running server over real HTTP and sends
schema-valid (positive) and schema-invalid (negative) requests with the bearer token, then checks
every answer against the same document. Shared by tests/unit/test_http_contract.py (fake manager) and
tests/integration/test_http_contract.py (a real LXC sandbox).

What "keeps the contract" means here, check by check:

- a request the document allows is accepted (2xx) or answered with a documented 4xx for a state
  conflict (403/404/409/413: no such sandbox, file or snapshot, a name taken, a file too large), or a
  documented state answer of the runtime (504: the command ran past its timeout; 507: disk full), or a
  400 file_name_too_long for a path with a name over 255 bytes (JSON Schema's lengths count characters,
  Linux's bytes: no schema can say it);
- a request the document forbids is a 4xx, never a 2xx, never a 5xx;
- every status code answered is documented for its operation, with the documented media type, headers
  and body schema (Schemathesis: status_code_conformance, content_type_conformance,
  response_headers_conformance, response_schema_conformance);
- a method the document does not declare on a path gets 405 with an Allow header (unsupported_method,
  from the coverage phase); a route that needs the token refuses a request without it (ignored_auth);
- every server-sent event of ``POST .../exec`` with ``"stream": true`` is one of stdout/stderr/exit/error
  with JSON data matching ExecOutputEvent/ExecExitEvent/ExecErrorEvent, the terminal event (exit or
  error) comes once and last, and an error event's status is documented (checked here: Schemathesis
  validates each event only against the media type's own schema).

Stateful (issue 35, tests/http_stateful.py): the document's links (a create's answer to every route of
the sandbox it made, a started background command's to its process routes) make a state machine; runs
scenarios of linked calls, each answer held to the same checks and none a success on a sandbox the
scenario destroyed, and reports which operations it reached through a link. (Not Schemathesis' own
use_after_free and ensure_resource_availability: they take a route's path for its resource, but a 404
on a sandbox's routes may name a file or a process, and a DELETE of .../files removes a file, not the
routes below it.)
Without links the fuzzer never reached a process route with a pid that exists.

Offline: Schemathesis 4.x sends no telemetry and uploads no report (its source has no such code; the
pytest run writes no report unless asked); the document has no remote ``$ref`` or ``externalValue``, so
nothing but the server under test is contacted (the unit run passes inside a network namespace with only
loopback). Hypothesis' example database is off: nothing is written under the repository.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
import referencing
import referencing.jsonschema
import schemathesis
import schemathesis.checks
from hypothesis import strategies as st
from schemathesis import Case, HookContext
from schemathesis.generation.meta import TestPhase
from schemathesis.schemas import BaseSchema

__all__ = [
    "CHECKS",
    "Steering",
    "call_and_check",
    "check_answer",
    "examples_per_operation",
    "load_published_schema",
    "sse_events",
    "whole_number",
]

EXAMPLES_ENV = "SANDBOX_RT_FUZZ_EXAMPLES"  # examples per operation (the fuzzing phase); default: quick
SEED_ENV = "SANDBOX_RT_FUZZ_SEED"  # replay a run (Schemathesis prints its seed on a failure)

# a request the document allows: accepted, or a documented answer for a state of the runtime (see above)
POSITIVE_STATUSES = ["2xx", "403", "404", "409", "413", "504", "507"]
# a request the document forbids: any client error, never a success nor a server error
NEGATIVE_STATUSES = ["4xx"]
# never a server error, except the documented state answers a valid request can get
NOT_A_SERVER_ERROR = ["2xx", "3xx", "4xx", "504", "507"]

_NAME_MAX, _PATH_MAX = 255, 4095  # bytes of one name and of a whole path Linux takes


def _name_too_long(response: Any, case: Case[Any]) -> bool:
    """A 400 file_name_too_long for a request with a path Linux refuses: over 255 bytes in a name or 4095
    in all, in UTF-8. JSON Schema counts characters, so no schema can rule such a path out."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    given = [*(case.query or {}).values(), *(case.body.values() if isinstance(case.body, dict) else ())]
    for path in (p for p in given if isinstance(p, str)):
        raw = path.encode("utf-8", "surrogatepass")
        if len(raw) > _PATH_MAX or any(len(name) > _NAME_MAX for name in raw.split(b"/")):
            return bool(code == "file_name_too_long")
    return False


def positive_data_acceptance(ctx: Any, response: Any, case: Case[Any]) -> bool | None:
    """Schemathesis' check, but a name too long in bytes (see :func:`_name_too_long`) is the request's
    documented 400, and a body the client framed with Transfer-Encoding (see :func:`_sent_chunked`) gets
    the documented 411 whatever its data."""
    if response.status_code == 400 and _name_too_long(response, case):
        return None
    if response.status_code == 411 and _sent_chunked(response):
        return None
    return schemathesis.checks.positive_data_acceptance(ctx, response, case)


def _sent_chunked(response: Any) -> bool:
    """Whether the request went with a Transfer-Encoding: the framing, not the data, that the server refuses
    (docs/http-api.md). Requests picks it by itself for a form body that encodes to nothing, e.g.
    ``{"1e100": []}``: an empty body without a Content-Length, which urllib3 then sends chunked."""
    names = {name.lower() for name in response.request.headers}
    no_length = response.request.body is not None and "content-length" not in names
    return "transfer-encoding" in names or no_length


CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.response_schema_conformance,
    positive_data_acceptance,
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.unsupported_method,
    schemathesis.checks.ignored_auth,
    schemathesis.checks.allow_header_conformance,
]

SSE_SCHEMAS = {
    "stdout": "ExecOutputEvent",
    "stderr": "ExecOutputEvent",
    "exit": "ExecExitEvent",
    "error": "ExecErrorEvent",
}


def _pytest_compat() -> None:
    """``schemathesis.pytest.from_fixture`` (4.32) reads and rewrites ``request.node._nodeid`` to name each
    operation's subtest; pytest 9.2 keeps a node's id in ``Node._id`` behind the read-only ``nodeid``, so the
    lazy loader fails with AttributeError before running anything. A read-through ``_nodeid`` (renames are
    dropped: the subtests still carry the operation's label) until Schemathesis follows pytest."""
    if not hasattr(pytest.Item, "_nodeid"):
        read_through = property(lambda self: self.nodeid, lambda self, value: None)
        pytest.Item._nodeid = read_through  # type: ignore[attr-defined]


_pytest_compat()


def whole_number(env: str, default: int) -> int:
    """``$env`` as a whole number >= 1, or ``default`` when it is not set."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{env}={raw!r} must be a whole number >= 1")
    return int(raw)


def examples_per_operation(default: int) -> int:
    """``$SANDBOX_RT_FUZZ_EXAMPLES`` (a bigger run, e.g. nightly) or ``default`` (the quick one)."""
    return whole_number(EXAMPLES_ENV, default)


# -- steering: requests that name a sandbox, snapshot or file often name one that exists ---------------------
@dataclass
class Steering:
    """What the hooks may put in place of a generated value that is valid where it stands (a valid value
    is only ever replaced by another valid one, so a negative case stays negative). Each list is read
    when a case is drawn, so it may change while the run goes on; the generated value stays a choice
    too (the "no such thing" paths are fuzzed as well)."""

    sandbox_ids: Callable[[], Sequence[str]]
    snapshot_names: Callable[[], Sequence[str]] = lambda: ()
    file_paths: Callable[[], Sequence[str]] = lambda: ()
    templates: Callable[[], Sequence[str]] = lambda: ()
    pids: Callable[[], Sequence[int]] = lambda: ()
    volume_names: Callable[[], Sequence[str]] = lambda: ()
    # ids DELETE /v1/sandboxes/{id} may name (default: sandbox_ids); names DELETE /v1/snapshots/{name} may
    # name (default: snapshot_names)
    deletable_ids: Callable[[], Sequence[str]] | None = None
    deletable_snapshot: Callable[[str], str] | None = None
    # last word on a body (after steering), e.g. to label what a create makes or to keep commands tame
    body: Callable[[str, Any], Any] | None = None


_ID = re.compile(r"sbx-[0-9a-f]{10}")
_SNAPSHOT = re.compile(r"[A-Za-z][A-Za-z0-9_-]{1,39}")
_TEMPLATE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
_VOLUME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_VOLUME_OPS = ("getVolume", "deleteVolume")  # their {name} is a volume's, not a snapshot's
_MAX_PID = 1 << 22


def _choose(value: Any, valid: bool, options: Sequence[Any]) -> st.SearchStrategy[Any]:
    if not valid or not options:
        return st.just(value)
    return st.sampled_from([*dict.fromkeys(options), value])


def _swap(key: str, values: st.SearchStrategy[Any]) -> Callable[[dict[str, Any]], st.SearchStrategy[Any]]:
    return lambda body: values.map(lambda v: {**body, key: v})


def _operation_id(context: HookContext) -> str:
    operation = context.operation
    if operation is None:
        return ""
    return str(operation.definition.raw.get("operationId", operation.label))


def _install_hooks(schema: BaseSchema, steer: Steering) -> None:
    def flatmap_path_parameters(context: HookContext, path_parameters: Any) -> st.SearchStrategy[Any]:
        if not isinstance(path_parameters, dict):
            return st.just(path_parameters)
        params = dict(path_parameters)
        op = _operation_id(context)
        strategy: st.SearchStrategy[dict[str, Any]] = st.just(params)
        sid = params.get("id")
        if isinstance(sid, str):
            ids = steer.sandbox_ids()
            if op == "deleteSandbox" and steer.deletable_ids is not None:
                ids = steer.deletable_ids()
            strategy = _choose(sid, bool(_ID.fullmatch(sid)), ids).map(lambda v: {**params, "id": v})
        name = params.get("name")
        if isinstance(name, str) and op in _VOLUME_OPS:
            volumes = _choose(name, bool(_VOLUME.fullmatch(name)), steer.volume_names())
            strategy = strategy.flatmap(lambda p: volumes.map(lambda v: {**p, "name": v}))
        elif isinstance(name, str) and _SNAPSHOT.fullmatch(name):
            if op == "deleteSnapshot" and steer.deletable_snapshot is not None:
                own = steer.deletable_snapshot(name)
                names = _choose(own, True, steer.snapshot_names())
            else:
                names = _choose(name, True, steer.snapshot_names())
            strategy = strategy.flatmap(lambda p: names.map(lambda v: {**p, "name": v}))
        pid = params.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool):
            pids = _choose(pid, 2 <= pid <= _MAX_PID, steer.pids())
            strategy = strategy.flatmap(lambda p: pids.map(lambda v: {**p, "pid": v}))
        return strategy

    def flatmap_query(context: HookContext, query: Any) -> st.SearchStrategy[Any]:
        if not isinstance(query, dict):
            return st.just(query)
        path = query.get("path")
        valid = isinstance(path, str) and path.startswith("/")
        return _choose(path, valid, steer.file_paths()).map(lambda v: {**query, "path": v})

    def flatmap_body(context: HookContext, body: Any) -> st.SearchStrategy[Any]:
        op = _operation_id(context)
        strategy: st.SearchStrategy[Any] = st.just(body)
        if isinstance(body, dict):
            swaps: list[tuple[str, re.Pattern[str], Sequence[Any]]] = []
            if op == "createSandbox":
                swaps = [
                    ("from_snapshot", _SNAPSHOT, steer.snapshot_names()),
                    ("template", _TEMPLATE, steer.templates()),
                ]
            elif op == "snapshotSandbox":
                swaps = [("name", _SNAPSHOT, steer.snapshot_names())]
            elif op in ("makeDirectory", "renameFile"):
                swaps = [
                    (key, re.compile(r"/.*", re.S), steer.file_paths()) for key in ("path", "src", "dst")
                ]
            for key, pattern, options in swaps:
                if key in body:
                    value = body[key]
                    valid = isinstance(value, str) and bool(pattern.fullmatch(value))
                    strategy = strategy.flatmap(_swap(key, _choose(value, valid, options)))
        if steer.body is not None:
            last = steer.body
            strategy = strategy.map(lambda b: last(op, b))
        return strategy

    turn = itertools.count()

    def map_case(context: HookContext, case: Case[Any]) -> Case[Any]:
        """The coverage phase (deterministic, no flatmap hooks) names a seeded sandbox, snapshot or file in
        every other case, so that its boundary values and content-type probes reach a real handler."""
        if case.meta is None or case.meta.phase.name != TestPhase.COVERAGE or next(turn) % 2:
            return case
        op = _operation_id(context)
        params = case.path_parameters
        if params is not None:
            sid = params.get("id")
            ids = list(steer.sandbox_ids())
            if op == "deleteSandbox" and steer.deletable_ids is not None:
                ids = list(steer.deletable_ids())
            if isinstance(sid, str) and _ID.fullmatch(sid) and ids:
                params["id"] = ids[next(turn) % len(ids)]
            name = params.get("name")
            names = list(steer.volume_names() if op in _VOLUME_OPS else steer.snapshot_names())
            pattern = _VOLUME if op in _VOLUME_OPS else _SNAPSHOT
            if isinstance(name, str) and pattern.fullmatch(name) and names and op != "deleteSnapshot":
                params["name"] = names[0]
            pid, pids = params.get("pid"), list(steer.pids())
            if isinstance(pid, int) and not isinstance(pid, bool) and 2 <= pid <= _MAX_PID and pids:
                params["pid"] = pids[next(turn) % len(pids)]
        query = case.query
        paths = list(steer.file_paths())
        if (
            query is not None
            and isinstance(query.get("path"), str)
            and query["path"].startswith("/")
            and paths
        ):
            query["path"] = paths[next(turn) % len(paths)]
        return case

    schema.hook(flatmap_path_parameters)
    schema.hook(flatmap_query)
    schema.hook(flatmap_body)
    schema.hook(map_case)


def load_published_schema(
    base_url: str,
    token: str,
    steer: Steering,
    *,
    max_examples: int,
    coverage: bool = True,
    shrink: bool = True,
    request_timeout: float = 30.0,
    stateful: bool = False,
) -> BaseSchema:
    """The document the server at ``base_url`` publishes at /openapi.json (fetched over HTTP, without the
    token: it is public), configured for the contract run against that same server. ``stateful``: for
    :func:`run_stateful`, with the document's own links only (Schemathesis infers none)."""
    config: dict[str, Any] = {
        "base-url": base_url,
        # the document's own security scheme (bearerAuth) carries the token: public routes go without it
        "auth": {"openapi": {"bearerAuth": {"bearer": token}}},
        "generation": {
            "mode": "all",
            "max-examples": max_examples,
            "database": "none",
            "no-shrink": not shrink,
        },
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": coverage},
            "fuzzing": {"enabled": True},
            # chains of valid calls (invalid ones are the other phases' part), along the document's links
            "stateful": {
                "enabled": stateful,
                "generation": {"mode": "positive"},
                "inference": {"algorithms": []},
            },
        },
        "checks": {
            "not_a_server_error": {"expected-statuses": NOT_A_SERVER_ERROR},
            "positive_data_acceptance": {"expected-statuses": POSITIVE_STATUSES},
            "negative_data_rejection": {"expected-statuses": NEGATIVE_STATUSES},
        },
        "request-timeout": request_timeout,
        "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large", "large_base_example"],
        "cache": {"enabled": False},
    }
    seed = os.environ.get(SEED_ENV, "").strip()
    if seed:
        config["seed"] = int(seed)
    schema = schemathesis.openapi.from_url(
        f"{base_url}/openapi.json", config=schemathesis.Config.from_dict(config), timeout=request_timeout
    )
    _install_hooks(schema, steer)
    return schema


# -- one case: send it, check the answer --------------------------------------------------------------------
def _registry(document: dict[str, Any]) -> referencing.Registry[Any]:
    resource = referencing.Resource.from_contents(
        document, default_specification=referencing.jsonschema.DRAFT202012
    )
    registry: referencing.Registry[Any] = referencing.Registry().with_resource("urn:openapi", resource)
    return registry


def sse_events(content: bytes) -> list[tuple[str, str]]:
    """(event name, data) of a text/event-stream body (data lines joined; comments and ids ignored)."""
    events: list[tuple[str, str]] = []
    name = ""
    data: list[str] = []
    for line in re.split(r"\r\n|\r|\n", content.decode("utf-8")):
        if not line:
            if data:
                events.append((name or "message", "\n".join(data)))
            name, data = "", []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
    if data:
        events.append((name or "message", "\n".join(data)))
    return events


def check_event_stream(case: Case[Any], status: int, content: bytes) -> None:
    """Every event of an exec stream against the document's event schemas (AssertionError naming it)."""
    document = case.operation.schema.raw_schema
    registry = _registry(document)
    documented = {int(code) for code in case.operation.definition.raw["responses"] if code.isdigit()}
    encoding = case.body.get("encoding", "utf-8") if isinstance(case.body, dict) else "utf-8"
    events = sse_events(content)
    where = f"{case.operation.label} (HTTP {status}) stream {[n for n, _ in events]}"
    assert events, f"{where}: no events"
    terminal = [i for i, (name, _) in enumerate(events) if name in ("exit", "error")]
    assert terminal == [len(events) - 1], f"{where}: exit or error must come once, as the last event"
    for name, raw in events:
        assert name in SSE_SCHEMAS, f"{where}: undocumented event {name!r}"
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise AssertionError(f"{where}: event {name} data is not JSON: {raw[:200]!r}") from exc
        validator = jsonschema.Draft202012Validator(
            {"$ref": f"urn:openapi#/components/schemas/{SSE_SCHEMAS[name]}"}, registry=registry
        )
        errors = [e.message for e in validator.iter_errors(data)]
        assert not errors, f"{where}: event {name} {data!r:.300} does not match {SSE_SCHEMAS[name]}: {errors}"
        if name in ("stdout", "stderr") and encoding == "base64":
            try:
                base64.b64decode(data["data"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise AssertionError(f"{where}: event {name} data is not base64: {data!r:.200}") from exc
        if name == "error":
            assert data["status"] in documented, f"{where}: error event status {data['status']} undocumented"


def _resolved(document: dict[str, Any], node: Any) -> Any:
    """``node`` with its local ``$ref`` (a chain of them) followed."""
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
        target: Any = document
        for part in node["$ref"][2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def check_media_type(case: Case[Any], status: int, sent_content_type: str | None) -> None:
    """A body of a media type the operation does not declare is a request the document forbids: a 4xx.
    (Schemathesis sends such bodies in its coverage phase but only reports a 5xx to them.)"""
    body = _resolved(case.operation.schema.raw_schema, case.operation.definition.raw.get("requestBody", {}))
    declared = body.get("content", {})
    if not declared or not sent_content_type:
        return
    sent = _media_type(sent_content_type)
    kinds = {_media_type(m) for m in declared}
    if sent in kinds or "*/*" in kinds or f"{sent.split('/')[0]}/*" in kinds:
        return
    assert 400 <= status < 500, (
        f"{case.operation.label}: a body of the undeclared media type {sent_content_type!r} (declared: "
        f"{', '.join(sorted(kinds))}) was answered {status}, not a 4xx (415 Unsupported Media Type)"
    )


def check_answer(case: Case[Any], response: Any) -> None:
    """Hold ``response`` (Schemathesis' Response to ``case``) to the document."""
    case.validate_response(response, checks=CHECKS)
    check_media_type(case, response.status_code, response.request.headers.get("Content-Type"))
    content_type = ",".join(response.headers.get("content-type", []))
    if response.status_code < 300 and content_type.lower().startswith("text/event-stream"):
        check_event_stream(case, response.status_code, response.content)


def call_and_check(case: Case[Any], *, timeout: float = 30.0) -> Any:
    """Send ``case`` to the server (a connection of its own: what is checked is the answer, not the reuse of
    a connection, which tests/unit/test_http_api.py covers) and hold its answer to the document; the answer
    (Schemathesis' Response)."""
    response = case.call(timeout=timeout)
    check_answer(case, response)
    return response
