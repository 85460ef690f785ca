"""The old import path of the HTTP API's server, kept for code written against it: it is
:mod:`sandbox_rt.web.server` now (``from sandbox_rt.web.server import ApiServer, load_token, serve``).
Nothing in the package imports this module."""

import warnings

from .web.server import *  # noqa: F403 (the old path names what the new one names)
from .web.server import __all__ as _names

__all__ = list(_names)

warnings.warn(
    "sandbox_rt.http_api is sandbox_rt.web.server now: import it from there",
    DeprecationWarning,
    stacklevel=2,
)
