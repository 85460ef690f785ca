"""One piece of work in a thread beside the caller's (destroy removes the network state while the
container stops)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Background"]


class Background:
    """Run ``work`` in a thread for the ``with`` block; :meth:`result` waits and re-raises its
    error. Leaving the block by an exception still waits for it (and keeps the first error)."""

    def __init__(self, work: Callable[[], None]) -> None:
        self._work = work
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sandbox-rt-background", daemon=True)

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
