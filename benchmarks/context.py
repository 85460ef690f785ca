"""What every benchmark group shares: options, settings, the LXC manager, labels, cleanup."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sandbox_rt
from sandbox_rt import Manager, Settings

from .raw import RawLxc

__all__ = ["Bench", "Options"]


@dataclasses.dataclass(frozen=True)
class Options:
    runs: int = 20
    quick: bool = False
    transfer_mb: int = 100
    concurrency: tuple[int, ...] = (10, 25, 50)
    concurrency_rounds: int = 3
    density: tuple[int, ...] = (100, 250, 500, 1000)  # sandboxes alive at once (the density group)
    throughput: tuple[int, ...] = (8, 32)  # caller threads looping create/exec/destroy (throughput)
    throughput_s: float = 20.0  # the throughput group's measured window per phase (after a warm-up)
    memory_mb: int = 512  # the sandboxes' memory limit (a limit, not a reservation)

    @classmethod
    def quick_mode(cls, runs: int | None = None) -> Options:
        return cls(
            runs=runs or 3,
            quick=True,
            transfer_mb=20,
            concurrency=(5,),
            concurrency_rounds=1,
            density=(10,),
            throughput=(4,),
            throughput_s=4.0,
        )


class Bench:
    """One benchmark run. Every sandbox it makes carries ``bench=1`` and ``bench-run=<id>``;
    :meth:`close` destroys whatever of this run is still there (also after Ctrl-C).

    Ctrl-C/SIGTERM set :attr:`stop`; the groups call :meth:`checkpoint` between steps, which then
    raises KeyboardInterrupt at a point where every ``finally`` can still destroy what it made (an
    interrupt raised inside paramiko or subprocess can be swallowed there or leave a lock held).
    """

    def __init__(self, opts: Options, settings: Settings | None = None) -> None:
        self.opts = opts
        self.settings = settings or Settings.load()
        self.mgr = Manager(self.settings)
        self.run_id = secrets.token_hex(5)
        self.labels = {"bench": "1", "bench-run": self.run_id}
        self.raw = RawLxc(self.settings)
        self.tmp = Path(tempfile.mkdtemp(prefix="sandbox-rt-bench-"))
        self.stop = threading.Event()
        self.raw.sweep(stale_pve=True)  # raw containers of benchmark runs that were killed

    def checkpoint(self) -> None:
        """Raise KeyboardInterrupt if a stop was requested."""
        if self.stop.is_set():
            raise KeyboardInterrupt

    def create(self, mgr: Manager | None = None, **kwargs: Any) -> sandbox_rt.Sandbox:
        kwargs.setdefault("memory_mb", self.opts.memory_mb)
        return (mgr or self.mgr).create(labels=self.labels, **kwargs)

    @contextlib.contextmanager
    def sandbox(self, mgr: Manager | None = None, **kwargs: Any) -> Iterator[sandbox_rt.Sandbox]:
        sb = self.create(mgr, **kwargs)
        try:
            yield sb
        finally:
            sb.destroy()

    @contextlib.contextmanager
    def template_variant(self, edit: Callable[[list[str]], list[str]]) -> Iterator[Manager]:
        """A Manager whose template is a throw-away copy of the real one's config, ``edit``-ed (its
        rootfs a symlink to the real one's); removed afterwards. The real template is never touched."""
        name = f"{self.settings.template}-bench-{self.run_id}-{secrets.token_hex(2)}"
        real, variant = self.settings.lxc_path / self.settings.template, self.settings.lxc_path / name
        variant.mkdir(mode=0o755)
        try:
            (variant / "rootfs").symlink_to(Path("..") / self.settings.template / "rootfs")
            config = (real / "config").read_text().splitlines()
            lines = [ln for ln in config if not ln.startswith("lxc.rootfs.path")]
            lines = [*edit(lines), f"lxc.rootfs.path = dir:{variant / 'rootfs'}"]
            (variant / "config").write_text("\n".join(lines) + "\n")
            yield Manager(dataclasses.replace(self.settings, template=name))
        finally:
            shutil.rmtree(variant, ignore_errors=True)

    def sweep(self, mgr: Manager | None = None) -> list[str]:
        """Destroy this run's sandboxes on ``mgr``'s backend and its raw containers."""
        gone: list[str] = []
        m = mgr or self.mgr
        for record in m.list(labels={"bench-run": self.run_id}):
            with contextlib.suppress(sandbox_rt.SandboxError):
                m.destroy(record.id)
                gone.append(record.id)
        if mgr is None:
            gone += self.raw.sweep()
        return gone

    def close(self) -> list[str]:
        try:
            return self.sweep()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
