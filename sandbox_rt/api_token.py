"""The bearer token of the HTTP API (and of MCP over HTTP): where it comes from and what it must be.

The token is never logged or printed. A token file must be a regular file of mode 0600 (or
stricter) owned by root or by the user running the server; the checks are made on the file that
was opened, not on its name.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import ConfigError

__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_ENV", "check_token", "is_loopback", "load_token"]

TOKEN_ENV = "SANDBOX_RT_API_TOKEN"
MIN_TOKEN_LENGTH = 16
TOKEN_FILE_MAX_BYTES = 4096
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: safe in a header


def check_token(token: str, source: str) -> str:
    """``token`` if it is usable (printable ASCII, no spaces, at least 16 characters), else ConfigError."""
    if not isinstance(token, str) or not token:
        raise ConfigError(f"the API token from {source} is empty")
    if not _TOKEN_CHARS.fullmatch(token):
        raise ConfigError(f"the API token from {source} must be printable ASCII without spaces")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the API token from {source} is shorter than {MIN_TOKEN_LENGTH} characters "
            "(make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def load_token(token_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> str:
    """The bearer token: the first line of ``token_file`` if given, else ``$SANDBOX_RT_API_TOKEN``.

    ConfigError if there is none, if it is shorter than 16 characters, or if the file is not a
    regular file of mode 0600 (or stricter) owned by root or by the user running the server.
    """
    if token_file is not None:
        path = Path(token_file)
        text = _read_token_file(path)
        lines = text.strip().splitlines()
        return check_token(lines[0].strip() if lines else "", f"token file {path}")
    value = (os.environ if env is None else env).get(TOKEN_ENV)
    if value is None:
        raise ConfigError(f"no API token: pass --token-file FILE or set {TOKEN_ENV}")
    return check_token(value.strip(), TOKEN_ENV)


def _read_token_file(path: Path) -> str:
    try:  # O_NONBLOCK: a FIFO put in its place does not hang the start
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    try:  # every check is made on the file that was opened, not on the name
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"token file {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"token file {path} has mode {mode:04o}: other users than its owner may read or change "
                f"it (chmod 600 {path})"
            )
        uid = os.geteuid()
        if st.st_uid not in (0, uid):
            raise ConfigError(
                f"token file {path} is owned by uid {st.st_uid}, not by root or the user running the "
                f"server (uid {uid}): chown it"
            )
        try:
            data = os.read(fd, TOKEN_FILE_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > TOKEN_FILE_MAX_BYTES:
        raise ConfigError(f"token file {path} is larger than {TOKEN_FILE_MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"token file {path} is not UTF-8 text") from exc


def is_loopback(host: str) -> bool:
    """A listening address only this machine can reach (the token then never crosses a network)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
