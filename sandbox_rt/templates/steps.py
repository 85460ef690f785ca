"""The typed steps of a :class:`~sandbox_rt.templates.Template`: values only (no pyinfra here).

Each step knows what it means to the cache (``fingerprint``: the bytes that identify it, copied files
included), which package sources it needs to reach (``egress``) and how it reads in progress output
(``describe``). ``ops.py`` turns each into pyinfra operations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = [
    "APT_SOURCES",
    "NPM_REGISTRY",
    "PIP_SOURCES",
    "AptInstall",
    "Copy",
    "Deploy",
    "Env",
    "NpmInstall",
    "PipInstall",
    "Run",
    "Step",
    "Workdir",
    "check_remote_abs",
]

# What the base image's package tools reach by default (Debian 12, PyPI, npm)
APT_SOURCES = ("deb.debian.org", "security.debian.org")
PIP_SOURCES = ("pypi.org", "files.pythonhosted.org")
NPM_REGISTRY = "registry.npmjs.org"

# apt, pip and npm package specs: a name, optionally pinned (=, ==, @, >=, ...); no options, no paths
_APT_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+~:-]+)?")
_PIP_PACKAGE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]+\])?(?:[=<>!~]=?[A-Za-z0-9.*+!-]+)?"
)
_NPM_PACKAGE = re.compile(r"(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(?:@[A-Za-z0-9.^~<>=*-]+)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_FILES = 20_000  # files one copy step may bring (a guard against copying a whole disk by mistake)


def check_remote_abs(path: object, what: str) -> str:
    """An absolute path inside the sandbox: no NUL, no newline, no ``..`` component."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or "\n" in path:
        raise ConfigError(f"{what} {path!r} must be an absolute path inside the sandbox")
    if ".." in path.split("/"):
        raise ConfigError(f"{what} {path!r} must not contain '..'")
    return path


def _packages(kind: str, pattern: re.Pattern[str], names: tuple[object, ...]) -> tuple[str, ...]:
    if not names:
        raise ConfigError(f"{kind}_install needs at least one package")
    for name in names:
        if not isinstance(name, str) or not pattern.fullmatch(name):
            raise ConfigError(f"{kind}_install: {name!r} is not a {kind} package name")
    return tuple(str(n) for n in names)


def _url_host(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in url for c in " \n\0'\""):
        raise ConfigError(f"{what} {url!r} must be an http(s) URL")
    return parts.hostname


class Step:
    """One step of a template definition."""

    kind: str = ""

    def describe(self) -> str:
        raise NotImplementedError

    def fingerprint(self) -> bytes:
        """What identifies this step to the cache (its kind and arguments, copied files' bytes)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return json.dumps([self.kind, fields], sort_keys=True, default=str).encode()

    def egress(self) -> tuple[str, ...]:
        """The hosts this step's package tool must reach during the build."""
        return ()


@dataclasses.dataclass(frozen=True)
class AptInstall(Step):
    packages: tuple[str, ...]
    kind = "apt_install"

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", _packages("apt", _APT_PACKAGE, self.packages))

    def describe(self) -> str:
        return f"apt_install({', '.join(self.packages)})"

    def egress(self) -> tuple[str, ...]:
        return APT_SOURCES


@dataclasses.dataclass(frozen=True)
class PipInstall(Step):
    packages: tuple[str, ...]
    index_url: str | None = None
    kind = "pip_install"

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", _packages("pip", _PIP_PACKAGE, self.packages))
        if self.index_url is not None:
            _url_host(self.index_url, "pip_install: index_url")

    def describe(self) -> str:
        where = f" from {self.index_url}" if self.index_url else ""
        return f"pip_install({', '.join(self.packages)}){where}"

    def egress(self) -> tuple[str, ...]:
        if self.index_url:
            return (_url_host(self.index_url, "index_url"),)
        return PIP_SOURCES


@dataclasses.dataclass(frozen=True)
class NpmInstall(Step):
    packages: tuple[str, ...]
    registry: str | None = None
    kind = "npm_install"

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", _packages("npm", _NPM_PACKAGE, self.packages))
        if self.registry is not None:
            _url_host(self.registry, "npm_install: registry")

    def describe(self) -> str:
        return f"npm_install({', '.join(self.packages)})"

    def egress(self) -> tuple[str, ...]:
        return (_url_host(self.registry, "registry"),) if self.registry else (NPM_REGISTRY,)


@dataclasses.dataclass(frozen=True)
class Run(Step):
    command: str
    kind = "run"

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command.strip() or "\0" in self.command:
            raise ConfigError(f"run: {self.command!r} is not a shell command")

    def describe(self) -> str:
        first = self.command.strip().splitlines()[0]
        return f"run({first[:60]}{'...' if len(first) > 60 else ''})"


@dataclasses.dataclass(frozen=True)
class Copy(Step):
    local: Path
    remote: str
    kind = "copy"

    def __post_init__(self) -> None:
        local = Path(self.local).expanduser()
        try:
            st = os.stat(local)
        except OSError as exc:
            raise ConfigError(f"copy: cannot read {local}: {exc.strerror or exc}") from exc
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise ConfigError(f"copy: {local} is neither a file nor a directory")
        object.__setattr__(self, "local", local.resolve())
        check_remote_abs(self.remote, "copy: remote")

    @property
    def is_dir(self) -> bool:
        return self.local.is_dir()

    def files(self) -> list[tuple[str, Path]]:
        """(path relative to ``local``, the file) of every regular file, sorted; a directory's
        symlinks and special files are refused (what the template gets must be what was hashed)."""
        if not self.is_dir:
            return [("", self.local)]
        out: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.local):
            dirnames.sort()
            for name in sorted([*filenames, *[d for d in dirnames if Path(dirpath, d).is_symlink()]]):
                path = Path(dirpath, name)
                if path.is_symlink() or not path.is_file():
                    raise ConfigError(f"copy: {path} is not a regular file (links are not copied)")
                out.append((str(path.relative_to(self.local)), path))
                if len(out) > _MAX_FILES:
                    raise ConfigError(f"copy: {self.local} has more than {_MAX_FILES} files")
        return out

    def fingerprint(self) -> bytes:
        digest = hashlib.sha256()
        digest.update(json.dumps([self.kind, self.remote, self.is_dir]).encode())
        for rel, path in self.files():
            mode = path.stat().st_mode & 0o7777
            digest.update(json.dumps([rel, mode]).encode())
            with path.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest().encode()

    def describe(self) -> str:
        return f"copy({self.local} -> {self.remote})"


@dataclasses.dataclass(frozen=True)
class Env(Step):
    values: tuple[tuple[str, str], ...]
    kind = "env"

    def __post_init__(self) -> None:
        if not self.values:
            raise ConfigError("env needs at least one variable")
        for name, value in self.values:
            if not _ENV_NAME.fullmatch(name):
                raise ConfigError(f"env: {name!r} is not a variable name")
            if not isinstance(value, str) or any(c in value for c in '\n\0"\\$`'):
                raise ConfigError(f'env: {name}={value!r}: a value is one line without " \\ $ `')

    def describe(self) -> str:
        return f"env({', '.join(n for n, _ in self.values)})"


@dataclasses.dataclass(frozen=True)
class Workdir(Step):
    path: str
    kind = "workdir"

    def __post_init__(self) -> None:
        check_remote_abs(self.path, "workdir")

    def describe(self) -> str:
        return f"workdir({self.path})"


@dataclasses.dataclass(frozen=True)
class Deploy(Step):
    """Any pyinfra deploy: a function (plain or ``@deploy``) that calls pyinfra operations."""

    fn: Callable[[], Any]
    egress_hosts: tuple[str, ...] = ()
    kind = "deploy"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"deploy: {self.fn!r} is not callable")

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "__qualname__", None) or getattr(self.fn, "__name__", repr(self.fn)))

    def fingerprint(self) -> bytes:
        """The function's name and source (what it imports or reads is not seen: skip_cache)."""
        target = inspect.unwrap(self.fn)
        try:
            source = inspect.getsource(target)
        except (OSError, TypeError):
            source = repr(getattr(target, "__code__", target))
        return json.dumps([self.kind, self.name, source, list(self.egress_hosts)]).encode()

    def describe(self) -> str:
        return f"deploy({self.name})"

    def egress(self) -> tuple[str, ...]:
        return self.egress_hosts
