"""A Sandbox handle reads its record again where it could otherwise act on a stale one: another
process, or the API's other dialect, may have relabelled or extended the sandbox since it attached.
Without that, extend() wrote the labels it attached with back over newer ones."""

from __future__ import annotations

import dataclasses
import time

from test_manager_cleanup import PUB, FakeBackend
from test_root_on_request import _Executor

from sandbox_rt import SandboxRecord, SandboxSpec
from sandbox_rt.sandbox import Sandbox


def _attached() -> tuple[Sandbox, FakeBackend]:
    backend = FakeBackend()
    record = SandboxRecord(
        "sbx-0000000002",
        "h",
        "127.0.0.1",
        PUB,
        SandboxSpec(labels={"v": "1"}),
        time.time(),
        None,
        1,
        "h",
        "fake",
    )
    backend.made[record.id] = record
    return Sandbox(record, backend, _Executor("sandbox", []), 30.0, None), backend  # type: ignore[arg-type]


def _relabel_elsewhere(backend: FakeBackend, sandbox_id: str, labels: dict[str, str]) -> None:
    old = backend.made[sandbox_id]
    backend.made[sandbox_id] = dataclasses.replace(old, spec=dataclasses.replace(old.spec, labels=labels))


def test_extend_keeps_labels_changed_since_attach() -> None:
    sb, backend = _attached()
    _relabel_elsewhere(backend, sb.id, {"v": "2"})
    sb.extend(600)
    assert backend.made[sb.id].spec.labels == {"v": "2"} and backend.made[sb.id].spec.ttl_s == 600


def test_status_shows_the_record_as_it_is_now() -> None:
    sb, backend = _attached()
    _relabel_elsewhere(backend, sb.id, {"v": "3"})
    assert sb.status().labels == {"v": "3"}
