"""The CLI's volumes: ``sandbox-rt volume create|ls|show|rm NAME`` and ``--volume`` of create/run."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import ConfigError
from .manager import Manager
from .models import VolumeMount

__all__ = ["add_volume_command", "parse_volume_flags", "volume_command"]


def parse_volume_flags(values: Sequence[str]) -> list[VolumeMount]:
    """``--volume SRC:PATH[:ro]`` values as mounts (checked again by ``create``)."""
    mounts = []
    for value in values:
        parts = value.split(":")
        read_only = len(parts) == 3 and parts[2] == "ro"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not read_only) or not all(parts[:2]):
            raise ConfigError(f"--volume {value!r} must be SRC:PATH or SRC:PATH:ro")
        source, path = parts[0], parts[1]
        if source.startswith("/"):
            mounts.append(VolumeMount(path, host_path=source, read_only=read_only))
        else:
            name, _, sub = source.partition("/")
            mounts.append(VolumeMount(path, volume=name, sub_path=sub or None, read_only=read_only))
    return mounts


def add_volume_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    vo = command("volume", help="named volumes: directories of this host that outlive sandboxes")
    vo.add_argument("action", choices=["create", "ls", "show", "rm"], help="what to do")
    vo.add_argument("names", nargs="*", metavar="NAME", help="the volume(s): create, show, rm")


def volume_command(args: argparse.Namespace, mgr: Manager, out: Callable[[Any, str], None]) -> int:
    store = mgr.volumes
    if args.action == "ls":
        volumes = store.list(size=True)
        lines = [f"{'NAME':32} {'CREATED':20} {'SIZE':>10} USED BY"]
        for v in volumes:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.created_at))
            size = f"{v.size_bytes / 1e6:.1f} MB" if v.size_bytes is not None else "-"
            lines.append(f"{v.name:32} {created:20} {size:>10} {','.join(v.used_by) or '-'}")
        out([dataclasses.asdict(v) for v in volumes], "\n".join(lines))
        return 0
    if not args.names:
        raise ConfigError(f"volume {args.action} needs a NAME")
    if args.action == "create":
        made = [store.create(name) for name in args.names]
        out([dataclasses.asdict(v) for v in made], "\n".join(v.name for v in made))
    elif args.action == "show":
        shown = [store.get(name) for name in args.names]
        data = [dataclasses.asdict(v) for v in shown]
        out(data[0] if len(data) == 1 else data, "\n".join(_describe(v) for v in data))
    else:
        for name in args.names:
            store.remove(name)
        out({"removed": args.names}, "")
    return 0


def _describe(volume: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in volume.items())
