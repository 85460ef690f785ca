"""A sandbox's spec with volumes survives every way it is read back and made again (issue 35, found by
fuzzing: ``POST /v1/sandboxes/{id}/extend`` of a sandbox made with volumes answered 400 ``volume {...}
must be a VolumeMount``). The stored records rebuild the VolumeMounts; what broke was a spec rebuilt
from ``dataclasses.asdict(spec)``, which turns them into dicts (extend, relabel, the OpenSandbox
dialect's renew)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_manager_cleanup import PUB, FakeBackend, _manager
from test_root_on_request import _Executor

from sandbox_rt import SandboxRecord, VolumeMount
from sandbox_rt.backends.lxc.container import read_record, write_record
from sandbox_rt.backends.records import spec_from_json, spec_to_json
from sandbox_rt.models import SandboxSpec
from sandbox_rt.sandbox import Sandbox
from sandbox_rt.validation import make_spec, respec

MOUNTS = (
    VolumeMount("/data", volume="work"),
    VolumeMount("/data/seed", host_path="/srv/seed", sub_path="in", read_only=True),
)


def _spec() -> SandboxSpec:
    return make_spec(labels={"v": "1"}, ttl_s=60, volumes=MOUNTS)


def _record(spec: SandboxSpec) -> SandboxRecord:
    return SandboxRecord("sbx-00000000a1", "h", "127.0.0.1", PUB, spec, time.time(), None, 1, "h", "fake")


def test_the_stored_records_give_back_volume_mounts(tmp_path: Path) -> None:
    spec = _spec()
    again = spec_from_json(json.loads(json.dumps(spec_to_json(spec))))  # PVE's description line, LXC's file
    assert again == spec and all(isinstance(m, VolumeMount) for m in again.volumes)
    write_record(tmp_path, _record(spec), None)
    assert read_record(tmp_path)[0].spec == spec


def test_respec_keeps_the_volumes_and_validates_the_change() -> None:
    spec = _spec()
    assert respec(spec, ttl_s=600) == make_spec(labels={"v": "1"}, ttl_s=600, volumes=MOUNTS)
    with pytest.raises(Exception, match="ttl_s"):
        respec(spec, ttl_s=-1)


def test_extend_and_relabel_a_sandbox_with_volumes() -> None:
    backend = FakeBackend()
    record = _record(_spec())
    backend.made[record.id] = record
    sb = Sandbox(record, backend, _Executor("sandbox", []), 30.0, None)  # type: ignore[arg-type]
    sb.extend(600)
    assert backend.made[record.id].spec.ttl_s == 600 and backend.made[record.id].spec.volumes == MOUNTS
    mgr = _manager(backend)
    assert mgr.extend(record.id, 900).spec.volumes == MOUNTS
    relabelled = mgr.relabel(record.id, {"v": "2"}).spec
    assert relabelled.labels == {"v": "2"} and relabelled.volumes == MOUNTS
