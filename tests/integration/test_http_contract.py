"""The published OpenAPI document is the contract, against real LXC sandboxes (issue 18 item 4): the
fuzzer of tests/http_contract.py, loaded from ``GET /openapi.json`` of an ``ApiServer`` in front of
``Manager.from_env()`` on a host prepared by site.yml, a few examples per operation.

Bounded and tidy on a real host:

- 3 examples per operation (``SANDBOX_RT_FUZZ_EXAMPLES`` to change it), no coverage phase (its
  boundary values are the unit fuzzer's job: here they would make dozens of real sandboxes), no
  shrinking (a failing create would be retried with real sandboxes);
- one seeded sandbox (with a file tree under /tmp/contract, a snapshot and two background commands) that
  requests often name; DELETE /v1/sandboxes/{id} only ever names a sandbox this run made, never the seed;
- every sandbox a create makes carries this run's label, and every snapshot name this run makes or
  deletes carries this run's prefix, so the run can only delete its own; commands are a few tame ones
  (the other exec fields stay fuzzed) and a wait without a timeout (or without a body) gets a short one;
- every sandbox and snapshot the run made is destroyed afterwards, whatever happened.

Stateful (issue 35): chains of calls along the document's links (a create to the routes of the sandbox it
made, a started background command to its process routes), on the sandboxes the chains make; quick here
(``SANDBOX_RT_FUZZ_SCENARIOS`` / ``SANDBOX_RT_FUZZ_STEPS`` for the full run); each scenario's sandboxes
are destroyed when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from schemathesis import Case, HookContext, Response
from schemathesis.core import NotSet
from schemathesis.schemas import BaseSchema

import sandbox_rt
from sandbox_rt.web.server import ApiServer
from tests.http_contract import Steering, call_and_check, examples_per_operation, load_published_schema
from tests.http_stateful import run_stateful, stateful_budget
from tests.integration.prepared import check_prepared

pytestmark = pytest.mark.slow

TOKEN = uuid.uuid4().hex + uuid.uuid4().hex
RUN = uuid.uuid4().hex[:12]
LABEL = {"test-http-contract": RUN}
PREFIX = f"ct{RUN}"  # every snapshot name this run makes or deletes
EXAMPLES = examples_per_operation(3)
STATEFUL = stateful_budget(12, 12)  # scenarios, calls each: 10-20 s on this host
REQUEST_TIMEOUT_S = 240.0  # a create (clone, start, SSH ready) on a loaded host
WAIT_CAP_S = 3.0  # a wait for a background command is given at most this
SCRATCH = "/tmp/contract"
FILES = (SCRATCH, f"{SCRATCH}/a.txt", f"{SCRATCH}/sub", f"{SCRATCH}/sub/b.bin", "/tmp")
TAME_COMMANDS: tuple[Any, ...] = (
    "true",
    "cat",
    "echo out; echo err >&2; exit 3",
    ["printf", "%s\\n", "a b"],
    "head -c 300 /dev/urandom",
    "pwd; env | sort | head -n 5",
)


@dataclass
class Run:
    manager: sandbox_rt.Manager
    server: ApiServer
    seed_id: str
    seed_snapshot: str
    pids: tuple[int, ...]
    created: list[str] = field(default_factory=list)


def _cleanup(manager: sandbox_rt.Manager, ids: list[str]) -> None:
    mine = set(ids) | {r.id for r in manager.list(labels=LABEL)}
    for sid in sorted(mine):
        with contextlib.suppress(sandbox_rt.SandboxError):
            manager.destroy(sid)
    for info in manager.list_snapshots():
        if info.name.startswith(PREFIX) or info.source_id in mine:
            with contextlib.suppress(sandbox_rt.SandboxError):
                manager.delete_snapshot(info.name)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    check_prepared()
    # the volumes the fuzzer makes live in a scratch directory, gone with the run
    settings = dataclasses.replace(sandbox_rt.Settings.load(), volume_dir=tmp_path_factory.mktemp("volumes"))
    manager = sandbox_rt.Manager(settings)
    created: list[str] = []
    try:
        sb = manager.create(cpus=1, memory_mb=512, labels=LABEL, ttl_s=1800, detached=True)
        created.append(sb.id)
        sb.files.mkdir(f"{SCRATCH}/sub")
        sb.write_file(f"{SCRATCH}/a.txt", "hello\n")
        sb.write_file(f"{SCRATCH}/sub/b.bin", bytes(range(256)))
        snapshot = manager.snapshot(sb.id, f"{PREFIX}seed").name
        running = sb.exec("cat", background=True)  # reads its stdin pipe until closed
        ended = sb.exec("true", background=True)
        ended.wait(30)
        with ApiServer(manager, token=TOKEN, host="127.0.0.1", port=0) as server:
            yield Run(manager, server, sb.id, snapshot, (running.pid, ended.pid), created)
    finally:
        _cleanup(manager, created)


def _tame(op: str, body: Any) -> Any:
    """Last word on a generated body (a valid value is only replaced by another valid one)."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if op == "createSandbox" and (out.get("labels") is None or isinstance(out.get("labels"), dict)):
        out["labels"] = {**(out.get("labels") or {}), **LABEL}
    if op in ("execCommand", "startProcess") and _valid_command(out.get("command")):
        out["command"] = TAME_COMMANDS[len(repr(out["command"])) % len(TAME_COMMANDS)]
    if op == "snapshotSandbox" and isinstance(out.get("name"), str) and not out["name"].startswith(PREFIX):
        out["name"] = _prefixed(out["name"])
    if op == "waitProcess":
        timeout = out.get("timeout")
        if timeout is None or (isinstance(timeout, int | float) and timeout > WAIT_CAP_S):
            out["timeout"] = WAIT_CAP_S
    return out


def _valid_command(command: Any) -> bool:
    if isinstance(command, str):
        return bool(command)
    return isinstance(command, list) and bool(command) and all(isinstance(w, str) for w in command)


def _prefixed(name: str) -> str:
    """A snapshot name of this run (still a valid one: a letter, then letters, digits, _ and -)."""
    return (PREFIX + name)[:40] if name[:1].isalpha() and name.isascii() else name


def _schema(run: Run, *, stateful: bool) -> BaseSchema:
    """The published document as the fuzzer uses it here. Stateful: pids are not steered (a process route
    gets the pid its link gives); a background command started first in a chain may name the seed."""
    steer = Steering(
        sandbox_ids=lambda: (run.seed_id,),
        snapshot_names=lambda: (run.seed_snapshot,),
        file_paths=lambda: FILES,
        templates=run.manager.templates,
        pids=(lambda: ()) if stateful else (lambda: run.pids),
        deletable_ids=lambda: tuple(sid for sid in run.created if sid != run.seed_id),
        deletable_snapshot=_prefixed,
        body=_tame,
    )
    schema = load_published_schema(
        run.server.url,
        TOKEN,
        steer,
        max_examples=EXAMPLES,
        coverage=False,
        shrink=False,
        request_timeout=REQUEST_TIMEOUT_S,
        stateful=stateful,
    )

    def after_call(context: HookContext, case: Case[Any], response: Response) -> None:
        """Remember every sandbox a request made (the label sweep is the second net)."""
        if (
            case.operation.definition.raw.get("operationId") == "createSandbox"
            and response.status_code == 201
        ):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                run.created.append(str(response.json()["id"]))

    def wait_briefly(context: HookContext, case: Case[Any]) -> Case[Any]:
        """A wait without a body would wait for ever on the running `cat`: give it a timeout."""
        operation_id = case.operation.definition.raw.get("operationId")
        if operation_id == "waitProcess" and isinstance(case.body, NotSet):
            case.body = {"timeout": WAIT_CAP_S}
            case.media_type = "application/json"
        return case

    schema.hook(after_call)
    schema.hook("map_case")(wait_briefly)
    return schema


@pytest.fixture(scope="module")
def published_schema(run: Run) -> BaseSchema:
    return _schema(run, stateful=False)


schema = schemathesis.pytest.from_fixture("published_schema")


@schema.parametrize()
def test_the_real_server_keeps_its_published_contract(case: Case[Any], run: Run) -> None:
    call_and_check(case, timeout=REQUEST_TIMEOUT_S)


def test_chains_along_the_links_keep_the_contract_on_real_sandboxes(run: Run) -> None:
    """Scenarios of linked calls on the sandboxes and background commands they make; every answer held to
    the document. The links lead somewhere: some call reached a made sandbox's route with a success."""
    made_before: set[str] = set(run.created)

    def destroy_what_the_scenario_made() -> None:
        for sid in [s for s in run.created if s not in made_before and s != run.seed_id]:
            with contextlib.suppress(sandbox_rt.SandboxError):
                run.manager.destroy(sid)
            made_before.add(sid)

    result = run_stateful(
        _schema(run, stateful=True),
        scenarios=STATEFUL.scenarios,
        steps=STATEFUL.steps,
        timeout=REQUEST_TIMEOUT_S,
        teardown=destroy_what_the_scenario_made,
    )
    print("reached through links:", sorted(result.reached()), "calls:", len(result.calls))
    assert result.reached() - {"deleteSnapshot", "getVolume", "deleteVolume"}, result.calls
