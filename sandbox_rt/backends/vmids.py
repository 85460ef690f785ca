"""Choosing a new CT's VMID without racing for it.

``GET /cluster/nextid`` answers the lowest free VMID and reserves nothing: every caller that asks
before the winner's clone request has created the CT's config gets the same number, and all but
one of their clones then fail with "already exists". Linked clones of one template also queue on
the template's lock, so a caller that waits there with the number it was given loses it again and
again (measured: 8 threads making 50 sandboxes ran out of 8 attempts). So the callers in one
process take turns from ``nextid`` until their clone request is accepted (:func:`allocating`);
callers in other processes or on other hosts can still collide, and after a collision the next
pick is spread randomly above the lowest free id (:func:`candidate`).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

SPREAD_MAX = 64

_guard = threading.Lock()
_turns: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def allocating(cluster: str) -> Iterator[None]:
    """One caller of this process at a time between ``nextid`` and its accepted clone request,
    per cluster (``cluster``: the API's address)."""
    with _guard:
        turn = _turns.setdefault(cluster, threading.Lock())
    with turn:
        yield


def spread(collisions: int) -> int:
    """How far above the lowest free id to pick after ``collisions`` lost races (0: none)."""
    return 0 if collisions <= 0 else min(2**collisions, SPREAD_MAX)


def candidate(lowest_free: int, collisions: int) -> int:
    """The VMID to try: the lowest free one, or after a collision one a random step above it."""
    width = spread(collisions)
    return lowest_free + (random.randrange(width) if width else 0)
