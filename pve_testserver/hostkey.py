"""How a client learns a CT's SSH host key through the API (to pin it before the first SSH).

PVE has no API to read a file inside a container. The contract chosen here: before a CT's first
start, the host generates one ed25519 host key into the CT's root filesystem and publishes the
public half as one line of the CT's ``description`` (notes)::

    sandbox-rt-ssh-host-key: ssh-ed25519 AAAAC3Nza... root@<hostname>

so ``GET /nodes/{node}/lxc/{vmid}/config`` after the start task returned ``OK`` gives the key
(the line is kept across restarts and replaced if the key changes). On a real PVE host a
hookscript (``pre-start`` phase: write the key into the rootfs; then ``pct set --description``)
does the same; the test server's engines emulate that hook. Clients must treat a missing line as
"not pinnable" and refuse to connect.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HOSTKEY_PREFIX = "sandbox-rt-ssh-host-key: "


def generate_ed25519(comment: str) -> tuple[bytes, str]:
    """A fresh ed25519 key: (OpenSSH private key file bytes, public key line with comment)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} {comment}".strip()


def public_line_of(private: bytes, comment: str) -> str:
    """The public key line of an OpenSSH private key file."""
    key = serialization.load_ssh_private_key(private, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{public.decode()} {comment}".strip()


def with_hostkey(description: str | None, public_line: str) -> str:
    """``description`` with its host key line set to ``public_line`` (other lines kept)."""
    lines = [ln for ln in (description or "").splitlines() if not ln.startswith(HOSTKEY_PREFIX)]
    lines.append(HOSTKEY_PREFIX + public_line)
    return "\n".join(lines) + "\n"


def hostkey_of(description: str | None) -> str | None:
    """The published host key line (``ssh-ed25519 AAAA... comment``) or None."""
    for line in (description or "").splitlines():
        if line.startswith(HOSTKEY_PREFIX):
            return line[len(HOSTKEY_PREFIX) :].strip() or None
    return None


def without_hostkey(description: str | None) -> str:
    """``description`` without a published host key line."""
    return "\n".join(ln for ln in (description or "").splitlines() if not ln.startswith(HOSTKEY_PREFIX))
