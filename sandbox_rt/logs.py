"""What the runtime tells an operator: lifecycle events through :mod:`logging`.

Every event is one record of the ``sandbox_rt.events`` logger at INFO (a failure at WARNING) with
the fields ``event`` and ``sandbox_id`` (and what else the event knows: ``backend``, ``reason``,
``duration_s``, ``step``, ``error``), so a handler can filter or index by sandbox.
:func:`configure` sets up stderr (or ``--log-file``) for the CLI's long-running commands: text, or
JSON lines (``--log-format json``). Nothing secret is ever a field: ids, names, reasons and error types only
(an error's text is the runtime's own message, which never carries keys or tokens).
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError

__all__ = ["EVENTS", "JsonLinesFormatter", "configure", "event"]

EVENTS = logging.getLogger("sandbox_rt.events")
# the fields an event may carry (anything else passed to event() is a programming error)
FIELDS = ("event", "sandbox_id", "backend", "reason", "duration_s", "step", "error", "pooled", "count")


def event(name: str, sandbox_id: str | None = None, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log lifecycle event ``name`` (``create``, ``destroy``, ``gc``, ...) of ``sandbox_id``."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown event field(s): {sorted(unknown)}")
    if not EVENTS.isEnabledFor(level):
        return
    extra = {"event": name, "sandbox_id": sandbox_id, **fields}
    details = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    EVENTS.log(level, "%s %s%s", name, sandbox_id or "-", f" {details}" if details else "", extra=extra)


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and the event
    fields the record carries."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["exception"] = record.exc_info[0].__name__
        return json.dumps(out, ensure_ascii=False, default=str)


class _LogFile(logging.handlers.WatchedFileHandler):
    """A WatchedFileHandler whose file, first opened or reopened after a rotation, is 0640."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)  # the handler closes it


def configure(
    fmt: str = "text",
    *,
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    file: str | os.PathLike[str] | None = None,
) -> None:
    """Send the runtime's records to ``stream`` (stderr), or appended to ``file``, as ``text`` or
    ``json`` lines; paramiko only from WARNING.

    A ``file`` is reopened when it was moved or removed (``logging.handlers.WatchedFileHandler``), so
    logrotate rotates it without a signal or ``copytruncate`` (roles/sandbox_runtime installs the
    rotation for ``/var/log/sandbox_rt/*.log`` where logrotate exists). It is created 0640: records
    carry no secrets, but sandbox ids and labels are the operator's."""
    handler: logging.Handler
    if file is not None:
        path = Path(file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = _LogFile(path, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the log file {str(path)!r}: {exc.strerror or exc}") from None
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLinesFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("paramiko").setLevel(logging.WARNING)
