"""Built templates on the embedded default: a stopped build sandbox becomes a template container.

``<lxc_path>/built-<name>-<key[:12]>/`` holds ``config`` (the base template's, with its own rootfs
path and name) and ``rootfs/``: the base's root (``cp -a --reflink=auto``: on btrfs a few seconds for
the whole tree, no data copied) with the build's overlay delta applied on top, its files shifted from
the build sandbox's isolated ids back to the template range (container root = ``idmap_base``), as
``roles/template_build`` makes the default one. Sandboxes clone it like any template (``lxc-copy -s``).
It is written under ``.tmpl-build-<pid>-<random>`` and renamed into place last, so a failure or an
interrupt leaves no half template (a crashed builder's scratch dir is swept by the next build).

The delta is hostile input: it is walked without following links, whiteouts (0:0 character devices)
delete, opaque directories (``trusted.``/``user.overlay.opaque``) hide the base's entries, and owners
outside the build sandbox's id range are refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from ..backends.lxc.container import config_lines, config_value, id_base, rootfs_dirs
from ..backends.lxc.fstree import copy_tree, sweep_stale
from ..backends.lxc.idmap import ID_RANGE
from ..config import Settings
from ..errors import BackendError, ConfigError, TemplateBuildError
from ..models import DEFAULT_TEMPLATE
from ..template_registry import BuiltTemplate
from .checks import check_layer, strip_build_state

__all__ = ["apply_layer", "base_identity", "commit_build", "container_name", "remove_container"]

BUILD_PREFIX = ".tmpl-build-"
TRASH_PREFIX = ".tmpl-del-"
_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
_REDIRECT = ("trusted.overlay.redirect", "user.overlay.redirect")
_KEEP_XATTR = "user."  # user.* xattrs travel (not user.overlay.*); security.capability is refused


def container_name(name: str, key: str) -> str:
    return f"built-{name}-{key[:12]}"


def template_dir(settings: Settings, template: str) -> Path:
    if template == DEFAULT_TEMPLATE:
        return settings.lxc_path / settings.template
    settings.check_template(template)
    return settings.lxc_path / settings.lxc_templates()[template]


def template_rootfs(tdir: Path) -> Path:
    try:
        value = config_value(config_lines(tdir), "lxc.rootfs.path") or ""
    except OSError as exc:
        raise ConfigError(f"template {tdir.name} has no readable config: {exc}") from exc
    return Path(value.removeprefix("dir:"))


def base_identity(settings: Settings, base: str, built: BuiltTemplate | None) -> str:
    """What identifies the base to the cache: a built base's own key; otherwise its container, its
    config, its rootfs's source (template_build's tarball name) and when its root was last changed."""
    if built is not None:
        return f"built:{built.key}"
    tdir = template_dir(settings, base)
    digest = hashlib.sha256()
    try:
        digest.update((tdir / "config").read_bytes())
        source = tdir / "rootfs.source"
        digest.update(source.read_bytes() if source.exists() else b"-")
        rootfs = template_rootfs(tdir)
        for sub in ("", "etc", "etc/ssh", "usr/bin", "usr/lib"):
            with contextlib.suppress(OSError):
                digest.update(str((rootfs / sub).stat().st_mtime_ns).encode())
    except OSError as exc:
        raise ConfigError(f"template {base!r} ({tdir}) cannot be read: {exc}") from exc
    return f"{tdir.name}:{digest.hexdigest()}"


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _remove(path: str) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _xattrs(path: str) -> list[str]:
    try:
        return os.listxattr(path, follow_symlinks=False)
    except OSError:
        return []


def apply_layer(upper: Path, root: Path, *, shift: int, low: int, size: int = ID_RANGE) -> None:
    """Apply the overlay delta ``upper`` onto the real tree ``root``; owners ``- shift`` must land in
    ``[low, low + size)`` (the template's id range)."""

    def owner(st: os.stat_result, where: str) -> tuple[int, int]:
        uid, gid = st.st_uid - shift, st.st_gid - shift
        if not (low <= uid < low + size and low <= gid < low + size):
            raise TemplateBuildError(
                f"/{where} is owned by {st.st_uid}:{st.st_gid}, outside the build sandbox's ids",
                step="storing the template",
            )
        return uid, gid

    def copy_xattrs(src: str, dst: str) -> None:
        for name in _xattrs(src):
            if name.startswith(_KEEP_XATTR) and not name.startswith("user.overlay."):
                os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)

    def walk(rel: str) -> None:
        src_dir = os.path.join(upper, rel) if rel else str(upper)
        with os.scandir(src_dir) as it:
            names = sorted(e.name for e in it)
        for name in names:
            r = f"{rel}/{name}" if rel else name
            src, dst = os.path.join(upper, r), os.path.join(root, r)
            st = os.lstat(src)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: the file was deleted
                _remove(dst)
                continue
            if stat.S_ISDIR(st.st_mode):
                if any(x in _xattrs(src) for x in _REDIRECT):
                    raise TemplateBuildError(
                        f"/{r}: a renamed overlay directory", step="storing the template"
                    )
                have = _lstat(dst)
                if have is not None and not stat.S_ISDIR(have.st_mode):
                    _remove(dst)
                    have = None
                if have is not None and any(
                    os.getxattr(src, x, follow_symlinks=False) == b"y" for x in _OPAQUE if x in _xattrs(src)
                ):
                    shutil.rmtree(dst)
                    have = None
                if have is None:
                    os.mkdir(dst, 0o700)
                walk(r)
                os.lchown(dst, *owner(st, r))
                os.chmod(dst, mode)
                copy_xattrs(src, dst)
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
                continue
            _remove(dst)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(st.st_mode):
                fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    try:
                        left = st.st_size
                        while left > 0:
                            sent = os.copy_file_range(fd_in, fd_out, min(left, 1 << 30))
                            if sent == 0:
                                break
                            left -= sent
                        os.fchmod(fd_out, mode)
                    finally:
                        os.close(fd_out)
                finally:
                    os.close(fd_in)
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(dst, 0o600)
                os.chmod(dst, mode)
            else:  # sockets, devices: nothing a template needs (checks.py refuses devices)
                continue
            os.lchown(dst, *owner(st, r))
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(dst, mode)  # chown clears setuid bits: set the mode after it
                copy_xattrs(src, dst)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

    walk("")


def commit_build(
    settings: Settings, sandbox_id: str, *, base: str, name: str, key: str, steps: tuple[str, ...]
) -> BuiltTemplate:
    """Turn the stopped build sandbox ``sandbox_id`` into template container ``built-<name>-<key>``.
    Runs the hardening checks on its delta first (TemplateBuildError); all or nothing."""
    cdir = settings.lxc_path / sandbox_id
    _, upper = rootfs_dirs(cdir)
    shift = id_base(cdir, settings.idmap_base) - settings.idmap_base
    base_dir = template_dir(settings, base)
    base_root = template_rootfs(base_dir)
    strip_build_state(upper)
    check_layer(upper, base_root, user=settings.ssh_user)
    container = container_name(name, key)
    final = settings.lxc_path / container
    sweep_stale(settings.lxc_path, BUILD_PREFIX)
    sweep_stale(settings.lxc_path, TRASH_PREFIX)
    tmp = settings.lxc_path / f"{BUILD_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    entry = BuiltTemplate(name, container, key, base, "lxc", time.time(), steps)
    try:
        tmp.mkdir(mode=0o755)
        copy_tree(base_root, tmp / "rootfs", step="storing the template")
        apply_layer(upper, tmp / "rootfs", shift=shift, low=settings.idmap_base)
        lines = []
        for line in config_lines(base_dir):
            k = line.partition("=")[0].strip()
            if k == "lxc.rootfs.path":
                line = f"lxc.rootfs.path = dir:{final / 'rootfs'}"
            elif k == "lxc.uts.name":
                line = f"lxc.uts.name = {container}"
            lines.append(line)
        header = f"# Built by sandbox_rt from template {base!r} (build_template, key {key}); never started.\n"
        (tmp / "config").write_text(header + "\n".join(lines) + "\n")
        (tmp / "template.json").write_text(json.dumps({"name": name, **entry.to_json()}, indent=1) + "\n")
        if final.exists():  # the same definition rebuilt (skip_cache): the new one replaces it
            remove_container(settings, container)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackendError(
            f"{exc.strerror or exc} ({exc.filename or tmp})", step="storing the template"
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry


def remove_container(settings: Settings, container: str) -> None:
    """Remove a built template's container dir (renamed away first, so it is never half there)."""
    if not container.startswith("built-") or "/" in container:
        raise ConfigError(f"{container!r} is not a built template's container")
    path = settings.lxc_path / container
    trash = settings.lxc_path / f"{TRASH_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)
