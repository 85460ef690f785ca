"""Template generations on the embedded default: a rebuilt template is swapped in atomically while
sandboxes of the old one run.

A template's *slot* is the container name the host contract gives (host.json ``template`` /
``templates``, e.g. ``sandbox-template``). ``<lxc_path>/<slot>`` is a symbolic link to the
*generation* new creates clone, ``<slot>.<tag>`` (a container dir; ``tag``: 10 hex digits of the
rootfs tarball's cache key, so other packages or a new ``template_build_refresh`` give a new one).
``roles/template_build`` builds a new generation beside the current one, the hardening play runs
on it, then :func:`switch` repoints the link in one ``rename(2)``: a create resolves the link once
(:func:`resolve`) and clones that generation, so it sees the old or the new one, never a mix.

What a sandbox or snapshot was made from is in its record (``sandbox_rt.json``) or ``snapshot.json``
as ``template_container``: its start and its forks use that generation, whatever the link says now.
:func:`prune` removes a generation that is no longer current once no sandbox, snapshot or create in
progress uses it (:func:`users`); site.yml runs it after the switch and ``sandbox-rt gc`` / the
reaper run it too.

A host provisioned before generations has the slot as a real container dir (the first
generation). It stays so until its template is rebuilt; then :func:`switch` exchanges the dir for
the link (``renameat2(RENAME_EXCHANGE)``: creates never see the slot missing) and the old dir
becomes ``<slot>.legacy``, which records without ``template_container`` (written before
generations) use, and which is pruned like any old generation.

Standard library only: ``roles/template_build`` ships a copy of this file
(``files/template-generations.py``: the collection has no ``sandbox_rt/``; a unit test holds the two
equal) and runs it with the host's python3 (``main``).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "LEGACY_SUFFIX",
    "generation_name",
    "generations",
    "legacy",
    "prune",
    "resolve",
    "switch",
    "users",
]

LEGACY_SUFFIX = ".legacy"
TAG = re.compile(r"[0-9a-f]{10}")
_SANDBOX = re.compile(r"sbx-[0-9a-f]{10}")
_RECORD = "sandbox_rt.json"
_SNAPSHOT_PREFIX = "snap-"
_SNAPSHOT_FILE = "snapshot.json"
_MARKERS = Path(".runtime") / "creating"
_TRASH = ".tmpl-gen-del-"  # + <pid>-<random>: a generation being removed
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def generation_name(slot: str, tag: str) -> str:
    """The container of ``slot``'s generation ``tag``."""
    if not TAG.fullmatch(tag):
        raise ValueError(f"{tag!r} is not a generation tag (10 hex digits)")
    return f"{slot}.{tag}"


def _is_generation(slot: str, name: str) -> bool:
    if not name.startswith(slot + "."):
        return False
    rest = name[len(slot) + 1 :]
    return bool(TAG.fullmatch(rest)) or rest == LEGACY_SUFFIX[1:]


def resolve(lxc_path: Path, slot: str) -> str:
    """The container new creates of ``slot`` clone: the link's target, or the slot itself when it is
    a real dir (a host provisioned before generations, or a template built from code).
    FileNotFoundError if there is no such template; ValueError for a link that names anything but one
    of the slot's generations."""
    where = lxc_path / slot
    try:
        target = os.readlink(where)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a link: a container dir (or nothing usable)
            if where.is_dir():
                return slot
            raise FileNotFoundError(errno.ENOENT, "not a template container", str(where)) from None
        raise
    if "/" in target or not _is_generation(slot, target):
        raise ValueError(f"{where} -> {target!r} is not a generation of {slot}")
    return target


def legacy(lxc_path: Path, slot: str) -> str:
    """What a record or snapshot without ``template_container`` (written before generations) was made
    from: the slot while it is a real dir, else ``<slot>.legacy`` if that is left, else the current."""
    where = lxc_path / slot
    if where.is_dir() and not where.is_symlink():
        return slot
    if (lxc_path / f"{slot}{LEGACY_SUFFIX}").is_dir():
        return f"{slot}{LEGACY_SUFFIX}"
    return resolve(lxc_path, slot)


def generations(lxc_path: Path, slot: str) -> list[str]:
    """The generation dirs of ``slot`` on disk (``<slot>.<tag>``, ``<slot>.legacy``), sorted."""
    if not lxc_path.is_dir():
        return []
    found = (e for e in lxc_path.iterdir() if _is_generation(slot, e.name))
    return sorted(e.name for e in found if e.is_dir() and not e.is_symlink())


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _config_rootfs(cdir: Path) -> list[str]:
    """The paths a container's ``lxc.rootfs.path`` names (its lower layer(s) and upper)."""
    try:
        lines = (cdir / "config").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "lxc.rootfs.path":
            return value.strip().split(":")[1:]
    return []


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def users(lxc_path: Path, container: str, *, slot: str, name: str) -> list[str]:
    """What needs generation ``container`` of template ``name`` (slot ``slot``): sandboxes whose record
    or config names it, snapshots taken on it, and creates in progress (they may have resolved it
    just before a switch). Records and snapshots from before generations count for :func:`legacy`."""
    out: list[str] = []
    if not lxc_path.is_dir():
        return out
    rootfs = str(lxc_path / container / "rootfs")
    old = legacy(lxc_path, slot) if (lxc_path / slot).exists() or (lxc_path / slot).is_symlink() else slot
    for entry in sorted(lxc_path.iterdir()):
        if _SANDBOX.fullmatch(entry.name):
            record = _json(entry / _RECORD) or {}
            made_from = record.get("template_container")
            spec = record.get("spec")
            of_name = isinstance(spec, dict) and spec.get("template", "default") == name
            if (
                made_from == container
                or rootfs in _config_rootfs(entry)
                or (made_from is None and of_name and container == old)
            ):
                out.append(f"sandbox {entry.name}")
        elif entry.name.startswith(_SNAPSHOT_PREFIX):
            snap = _json(entry / _SNAPSHOT_FILE)
            if snap is None:
                continue
            taken_on = snap.get("template_container")
            if taken_on == container or (
                taken_on is None and snap.get("template", "default") == name and container == old
            ):
                out.append(f"snapshot {entry.name[len(_SNAPSHOT_PREFIX) :]}")
    markers = lxc_path / _MARKERS
    if markers.is_dir():
        for marker in sorted(markers.glob("*.json")):
            data = _json(marker) or {}
            if _pid_alive(data.get("pid")):
                out.append(f"create in progress {marker.stem}")
    return out


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); OSError where the kernel or libc lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        renameat2 = libc.renameat2
    except AttributeError as exc:
        raise OSError(errno.ENOSYS, "renameat2 is not available") from exc
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def _set_rootfs(cdir: Path) -> None:
    """Point a container dir's own ``lxc.rootfs.path`` at its own rootfs (after a rename)."""
    config = cdir / "config"
    lines = config.read_text().splitlines()
    own = f"lxc.rootfs.path = dir:{cdir / 'rootfs'}"
    out = [own if ln.partition("=")[0].strip() == "lxc.rootfs.path" else ln for ln in lines]
    tmp = cdir / "config.new"
    tmp.write_text("\n".join(out) + "\n")
    tmp.replace(config)


def switch(lxc_path: Path, slot: str, target: str) -> bool:
    """Make new creates of ``slot`` clone generation ``target``, atomically. False if they already do.

    A slot that is still a real dir (the first generation) becomes ``<slot>.legacy``: its sandboxes
    keep running on it (a mounted overlay does not see the rename) and forks of its snapshots find it
    there (its config is repointed at its new path)."""
    if not _is_generation(slot, target) or target.endswith(LEGACY_SUFFIX):
        raise ValueError(f"{target!r} is not a generation of {slot}")
    if not (lxc_path / target / "config").is_file():
        raise FileNotFoundError(errno.ENOENT, "generation has no config", str(lxc_path / target))
    where = lxc_path / slot
    if where.is_symlink() and os.readlink(where) == target:
        return False
    tmp = lxc_path / f".{slot}.switch-{os.getpid()}-{secrets.token_hex(3)}"
    os.symlink(target, tmp)
    try:
        if where.is_symlink() or not where.exists():
            os.replace(tmp, where)
            return True
        kept = lxc_path / f"{slot}{LEGACY_SUFFIX}"
        if kept.exists() or kept.is_symlink():
            left = "a legacy generation is left already: remove it first"
            raise FileExistsError(errno.EEXIST, left, str(kept))
        try:
            _exchange(tmp, where)  # the link is the slot now; the old dir is at tmp
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EINVAL):
                raise
            os.rename(where, kept)  # no exchange here: the slot is missing for one rename
            os.replace(tmp, where)
        else:
            os.rename(tmp, kept)
        _set_rootfs(kept)
        return True
    finally:
        if tmp.is_symlink():
            tmp.unlink()


def _sweep_trash(lxc_path: Path) -> None:
    for entry in lxc_path.glob(f"{_TRASH}*"):
        pid = entry.name[len(_TRASH) :].partition("-")[0]
        if not (pid.isdigit() and _pid_alive(int(pid))):
            shutil.rmtree(entry, ignore_errors=True)


def prune(lxc_path: Path, slot: str, name: str, *, dry_run: bool = False) -> list[str]:
    """Remove ``slot``'s generations that new creates no longer clone and nothing uses (renamed away
    first, so none is ever half there). Returns the removed (or, with ``dry_run``, removable) ones."""
    if not ((lxc_path / slot).exists() or (lxc_path / slot).is_symlink()):
        return []
    current = resolve(lxc_path, slot)
    removed: list[str] = []
    if not dry_run:
        _sweep_trash(lxc_path)
    for gen in generations(lxc_path, slot):
        if gen == current or users(lxc_path, gen, slot=slot, name=name):
            continue
        if not dry_run:
            trash = lxc_path / f"{_TRASH}{os.getpid()}-{secrets.token_hex(4)}"
            try:
                os.rename(lxc_path / gen, trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash)
        removed.append(gen)
    return removed


def main(argv: list[str]) -> int:
    """``resolve LXC_PATH SLOT`` | ``users LXC_PATH SLOT NAME CONTAINER`` |
    ``switch LXC_PATH SLOT TARGET`` | ``prune LXC_PATH SLOT NAME``: one JSON value on stdout."""
    usage = "usage: resolve|users|switch|prune LXC_PATH SLOT [NAME] [CONTAINER|TARGET]"
    if len(argv) < 3:
        print(usage, file=sys.stderr)
        return 2
    cmd, path, slot = argv[0], Path(argv[1]), argv[2]
    try:
        if cmd == "resolve" and len(argv) == 3:
            result: object = resolve(path, slot)
        elif cmd == "users" and len(argv) == 5:
            result = users(path, argv[4], slot=slot, name=argv[3])
        elif cmd == "switch" and len(argv) == 4:
            result = {"changed": switch(path, slot, argv[3])}
        elif cmd == "prune" and len(argv) == 4:
            result = prune(path, slot, argv[3])
        else:
            print(usage, file=sys.stderr)
            return 2
    except (OSError, ValueError) as exc:
        print(f"template generations: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
