"""The one exception the server raises to answer a request the way PVE answers it.

PVE's HTTP layer turns every failure into a status code, a reason phrase (the first line of the
message) and a JSON body ``{"data": null, "message": "...", "errors": {...}}`` (``errors`` only for
parameter errors). Handlers raise :class:`PVEError`; the server renders it.
"""

from __future__ import annotations

PARAM_MESSAGE = "Parameter verification failed.\n"


class PVEError(Exception):
    """An API error: HTTP status, PVE message (usually ending in a newline), per-parameter errors."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or {}

    @property
    def reason(self) -> str:
        """The HTTP reason phrase PVE sends: the message's first line, ASCII only."""
        first = self.message.split("\n", 1)[0].strip() or "Error"
        return first.encode("ascii", "replace").decode("ascii")

    def perl_string(self) -> str:
        """How PVE::Exception stringifies (``"$code $msg"`` plus ``key: error`` lines)."""
        text = self.message if self.message.endswith("\n") else self.message + "\n"
        if self.status != 500:
            text = f"{self.status} {text}"
        for key in sorted(self.errors):
            text += f"{key}: {self.errors[key]}\n"
        return text

    def __str__(self) -> str:
        if self.errors:
            detail = "; ".join(f"{k}: {v.strip()}" for k, v in sorted(self.errors.items()))
            return f"{self.status} {self.reason} ({detail})"
        return f"{self.status} {self.reason}"


def param_error(errors: dict[str, str]) -> PVEError:
    """HTTP 400 "Parameter verification failed." with per-parameter messages (raise_param_exc)."""
    return PVEError(400, PARAM_MESSAGE, errors)


def perm_error(what: str | None = None) -> PVEError:
    """HTTP 403 "Permission check failed (what)" (raise_perm_exc)."""
    msg = "Permission check failed"
    if what:
        msg += f" ({what})"
    return PVEError(403, msg + "\n")


def fail(message: str) -> PVEError:
    """A plain ``die "...\\n"`` in a PVE handler: HTTP 500 with the message as reason."""
    if not message.endswith("\n"):
        message += "\n"
    return PVEError(500, message)


def not_implemented(method: str, path: str, detail: str = "") -> PVEError:
    """HTTP 501 as pve-http-server answers an unknown method/path."""
    msg = f"Method '{method} {path}' not implemented"
    if detail:
        msg += f" {detail}"
    return PVEError(501, msg)
