"""The runtime of a host prepared by site.yml, for the integration tests of the front doors: a test
module's Manager, with every sandbox still carrying its labels destroyed afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import sandbox_rt
from tests.integration.provision_helpers import destroy_labelled


def check_prepared() -> None:
    """Fail (saying how to fix it) unless site.yml prepared this host: the template and the key."""
    s = sandbox_rt.Settings.load()
    if not (s.lxc_path / s.template / "config").is_file() or not s.ssh_key.is_file():
        pytest.fail(
            "this host is not prepared: run `ansible-playbook -i inventories/local site.yml`", pytrace=False
        )


@contextlib.contextmanager
def labelled_manager(labels: Mapping[str, str], **settings: Any) -> Iterator[sandbox_rt.Manager]:
    """``Manager.from_env()`` (with ``settings`` replaced); afterwards every sandbox with ``labels``
    (what a failed test left behind) is destroyed, and none may remain."""
    check_prepared()
    mgr = sandbox_rt.Manager(dataclasses.replace(sandbox_rt.Settings.load(), **settings))
    try:
        yield mgr
    finally:
        destroy_labelled(mgr, labels)
    assert not mgr.list(labels=labels), "sandboxes of this test module survived their cleanup"
