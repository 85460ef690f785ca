"""What each clone gets of its own, written into its overlay delta before it first starts: an SSH
host key (the runtime pins its public half), a machine-id, its names and its resolver; and a new
hostname for a running one (the warm pool's hand-out)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ...errors import BackendError
from .fstree import rewrite_file_beneath

__all__ = ["Overlay", "hosts_file", "seed_identity", "set_hostname", "write_into_upper"]


@dataclasses.dataclass(frozen=True)
class Overlay:
    """A clone's root: the template's rootfs (``lower``) under its own delta (``upper``), whose files
    belong to host ids ``shift`` above the template's (its isolated id map; 0 when shared)."""

    lower: Path
    upper: Path
    template_base: int  # the host uid of the template's root
    shift: int

    @property
    def root_uid(self) -> int:
        return self.template_base + self.shift


def hosts_file(ip: str, hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n{ip}\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def seed_identity(
    fs: Overlay, *, hostname: str, ip: str, dns_server: str, key_owner: tuple[int, int] | None = None
) -> str:
    """Write the clone's identity into ``fs.upper``; returns its host key's public half. The private
    key belongs to ``key_owner`` (uid, gid in the container) when given, else to root."""
    # the upper dir's root is the container's "/": give it the lower root's owner and mode
    # (lxc-copy creates it under the caller's umask, e.g. 0700, which would lock out the user)
    st = fs.lower.stat()
    os.chown(fs.upper, st.st_uid + fs.shift, st.st_gid + fs.shift)
    os.chmod(fs.upper, st.st_mode & 0o7777)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    pub_line = public.decode() + f" root@{hostname}"
    files: list[tuple[str, bytes, int]] = [
        ("etc/ssh/ssh_host_ed25519_key.pub", (pub_line + "\n").encode(), 0o644),
        ("etc/machine-id", (secrets.token_hex(16) + "\n").encode(), 0o444),
        ("etc/hostname", f"{hostname}\n".encode(), 0o644),
        ("etc/hosts", hosts_file(ip, hostname).encode(), 0o644),
        ("etc/resolv.conf", f"nameserver {dns_server}\n".encode(), 0o644),
    ]
    for rel, data, mode in files:
        write_into_upper(fs, rel, data, mode)
    write_into_upper(fs, "etc/ssh/ssh_host_ed25519_key", private, 0o600, owner=key_owner)
    return public.decode()


def write_into_upper(
    fs: Overlay, rel: str, data: bytes, mode: int, owner: tuple[int, int] | None = None
) -> None:
    """Create ``rel`` in the overlay's upper dir, owned by container root (or ``owner``, ids in the
    container), parents like the lower's.
    A fork's delta comes from a sandbox: nothing here follows a link it may have put there."""
    base = fs.root_uid
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        sub = Path(*parts[:i])
        target = fs.upper / sub
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        if not target.exists():
            src = fs.lower / sub
            st = src.stat() if src.is_dir() else None
            target.mkdir(mode=0o755)
            os.chown(target, st.st_uid + fs.shift if st else base, st.st_gid + fs.shift if st else base)
            os.chmod(target, (st.st_mode & 0o7777) if st else 0o755)
    path = fs.upper / rel
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        uid, gid = owner or (0, 0)
        os.fchown(fd, base + uid, base + gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def set_hostname(pid: int, ip: str, hostname: str) -> None:
    """Change the UTS name from the host (container root lacks CAP_SYS_ADMIN) and the files."""
    proc = subprocess.run(
        ["nsenter", "-t", str(pid), "-u", "hostname", hostname],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if proc.returncode != 0:
        raise BackendError(f"cannot set hostname {hostname!r}", step="update", detail=proc.stderr)
    hosts = hosts_file(ip, hostname)
    # the files belong to the sandbox: never write through a link it may have put there
    for rel, text in (("etc/hostname", f"{hostname}\n"), ("etc/hosts", hosts)):
        try:
            rewrite_file_beneath(f"/proc/{pid}/root", rel, text.encode())
        except OSError as exc:
            raise BackendError(
                f"cannot write /{rel} in the sandbox: {exc.strerror or exc}", step="update"
            ) from exc
