"""``Template``: a sandbox template defined in code, step by step (E2B's / Daytona's builders' shape).

>>> t = (Template().from_template("default").apt_install("jq")
...      .pip_install("requests").env(APP_ENV="dev").workdir("/srv/app").run("make"))

Nothing runs here: the steps are values. ``Manager.build_template(t, "name")`` applies them with pyinfra
to a build sandbox and stores the result as a named template (see :mod:`sandbox_rt.templates.build`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigError
from ..models import DEFAULT_TEMPLATE
from ..validation import check_egress, check_template_name
from .steps import (
    AptInstall,
    Copy,
    Deploy,
    Env,
    NpmInstall,
    PipInstall,
    Run,
    Step,
    Workdir,
)

__all__ = ["Template"]


def _names(first: str | Iterable[str], rest: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(first, str):
        return (first, *rest)
    return (*first, *rest)


class Template:
    """A chain of typed steps over a base template (``default`` unless :meth:`from_template`)."""

    def __init__(self, *, name: str | None = None) -> None:
        """``name``: the name to build it under when the caller gives none (the CLI's default)."""
        self.name = check_template_name(name) if name is not None else None
        self.base = DEFAULT_TEMPLATE
        self.steps: list[Step] = []
        self.extra_egress: list[str] = []

    def __repr__(self) -> str:
        return f"Template(base={self.base!r}, steps={[s.describe() for s in self.steps]})"

    def _add(self, step: Step) -> Template:
        self.steps.append(step)
        return self

    def from_template(self, name: str) -> Template:
        """Start from this named template (``sandbox-rt template ls``); must come first."""
        if self.steps:
            raise ConfigError("from_template must come before the other steps")
        self.base = check_template_name(name)
        return self

    def apt_install(self, packages: str | Iterable[str], *more: str) -> Template:
        """Install Debian packages (``apt.packages`` with ``update=True``)."""
        return self._add(AptInstall(_names(packages, more)))

    def pip_install(
        self, packages: str | Iterable[str], *more: str, index_url: str | None = None
    ) -> Template:
        """Install Python packages system-wide (``pip.packages``); ``index_url``: a PEP 503 index
        instead of PyPI (its host joins the build's egress list)."""
        return self._add(PipInstall(_names(packages, more), index_url))

    def npm_install(self, packages: str | Iterable[str], *more: str, registry: str | None = None) -> Template:
        """Install npm packages globally (``npm.packages``)."""
        return self._add(NpmInstall(_names(packages, more), registry))

    def run(self, command: str) -> Template:
        """Run a shell command as root (``server.shell``), in the working directory and environment
        the earlier :meth:`workdir` / :meth:`env` steps set."""
        return self._add(Run(command))

    def copy(self, local: str | os.PathLike[str], remote: str) -> Template:
        """Copy a local file (``files.put``) or directory (``files.sync``) to ``remote``; its bytes
        are part of the cache key."""
        return self._add(Copy(local, remote))  # type: ignore[arg-type]

    def env(self, **values: str) -> Template:
        """Set environment variables for the later steps and for every session of the sandboxes
        made from the template (``/etc/environment``, read by sshd's PAM)."""
        return self._add(Env(tuple(sorted(values.items()))))

    def workdir(self, path: str) -> Template:
        """Create ``path`` and run the later steps there."""
        return self._add(Workdir(path))

    def deploy(self, fn: Callable[[], Any], *, egress: Iterable[str] = ()) -> Template:
        """Run any pyinfra deploy (a function calling pyinfra operations) as root; ``egress``: the
        hosts it downloads from."""
        hosts = tuple(egress)
        if hosts:
            check_egress(list(hosts))
        return self._add(Deploy(fn, hosts))

    def allow(self, *destinations: str) -> Template:
        """Let the build reach these addresses, networks or names too (e.g. a package mirror)."""
        check_egress(list(destinations))
        self.extra_egress.extend(destinations)
        return self

    def egress(self) -> list[str]:
        """What the build sandbox may reach: the steps' package sources and :meth:`allow`'s."""
        out: list[str] = []
        for dest in [*(h for s in self.steps for h in s.egress()), *self.extra_egress]:
            if dest not in out:
                out.append(dest)
        return out
