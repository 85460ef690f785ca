"""Fixtures for the runtime against real LXC containers on a host prepared by site.yml."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

import sandbox_rt
from sandbox_rt import Manager, Settings

SESSION_LABEL = {"test-session": uuid.uuid4().hex[:12]}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = Settings.load()
    if not (s.lxc_path / s.template / "config").is_file() or not s.ssh_key.is_file():
        pytest.fail(
            "this host is not prepared: run `ansible-playbook -i inventories/local site.yml` "
            f"(template {s.lxc_path / s.template}, key {s.ssh_key})",
            pytrace=False,
        )
    return s


@pytest.fixture(scope="session")
def manager(settings: Settings) -> Iterator[Manager]:
    mgr = Manager(settings)
    yield mgr
    # whatever a failed test left behind goes, found by this session's label
    for record in mgr.list(labels=SESSION_LABEL):
        with contextlib.suppress(sandbox_rt.SandboxError):
            mgr.destroy(record.id)


@pytest.fixture
def make(manager: Manager) -> Iterator[object]:
    """``make(**create_kwargs)`` → a sandbox destroyed at the end of the test, also on failure."""
    made: list[sandbox_rt.Sandbox] = []

    def factory(**kwargs: object) -> sandbox_rt.Sandbox:
        labels = {**SESSION_LABEL, **dict(kwargs.pop("labels", {}) or {})}  # type: ignore[call-overload]
        sb = manager.create(labels=labels, **kwargs)  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield factory
    for sb in made:
        with contextlib.suppress(sandbox_rt.SandboxError):
            sb.destroy()


@pytest.fixture
def sandbox(make: object) -> sandbox_rt.Sandbox:
    return make(memory_mb=512)  # type: ignore[operator, no-any-return]
