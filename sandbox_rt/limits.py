"""The old import path of two kinds of limit, kept for code written against it: the bounds on what the
host takes from a sandbox are :mod:`sandbox_rt.output_limits` now, what one HTTP client may cost
(``HttpLimits``, ``HTTP_LIMITS``) is :mod:`sandbox_rt.web.limits`. Nothing in the package imports
this module."""

import warnings

from .output_limits import *  # noqa: F403 (the old path names what the new ones name)
from .output_limits import __all__ as _output_names
from .web.limits import HTTP_LIMITS, HttpLimits

__all__ = [*_output_names, "HTTP_LIMITS", "HttpLimits"]

warnings.warn(
    "sandbox_rt.limits is sandbox_rt.output_limits (what the host takes from a sandbox) and "
    "sandbox_rt.web.limits (HttpLimits) now: import them from there",
    DeprecationWarning,
    stacklevel=2,
)
