"""The build cache's key: a content hash of the base template's identity and every step (the bytes
of copied files included). The same definition over the same base is a cache hit."""

from __future__ import annotations

import hashlib

from .definition import Template

__all__ = ["KEY_VERSION", "cache_key"]

KEY_VERSION = b"sandbox_rt-template-v1"  # bump when what a step does for the same arguments changes


def cache_key(template: Template, base_identity: str) -> str:
    """The hex sha256 of ``base_identity`` and the definition's steps and extra egress."""
    digest = hashlib.sha256(KEY_VERSION + b"\0")
    for part in (base_identity.encode(), *(s.fingerprint() for s in template.steps)):
        digest.update(len(part).to_bytes(8, "big") + part)
    for dest in sorted(template.extra_egress):
        digest.update(b"allow\0" + dest.encode() + b"\0")
    return digest.hexdigest()
