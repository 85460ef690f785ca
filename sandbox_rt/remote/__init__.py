"""Clients of the HTTP API (``sandbox-rt serve``) in the shape of the in-process runtime, so agent
code runs unchanged on another machine: :class:`Client` (like :class:`~sandbox_rt.Manager`) and
:class:`AsyncClient` (like :class:`~sandbox_rt.AsyncManager`), raising the same
:mod:`sandbox_rt.errors`.

>>> from sandbox_rt import remote
>>> with remote.Client("http://127.0.0.1:8787", token_file="/etc/sandbox_rt/api.token") as client:
...     with client.create(memory_mb=512) as sb:
...         print(sb.exec("echo hi").text)
"""

from .aclient import AsyncClient, AsyncRemoteExecStream, AsyncRemoteSandbox
from .calls import DEFAULT_URL
from .client import Client, RemoteExecStream, RemoteSandbox
from .processes import AsyncRemoteCommands, AsyncRemoteProcess, RemoteCommands, RemoteProcess

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncRemoteCommands",
    "AsyncRemoteExecStream",
    "AsyncRemoteProcess",
    "AsyncRemoteSandbox",
    "Client",
    "RemoteCommands",
    "RemoteExecStream",
    "RemoteProcess",
    "RemoteSandbox",
]
