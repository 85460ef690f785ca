"""SSH to sandboxes, in layers (each module says what it holds):

- :mod:`.wire`: sockets, paramiko's transport with our algorithms, race-free sends, the receive
  window enforced against a lying server, bounded SFTP replies;
- :mod:`.markers`: the end-marker protocol of one command (wrapper text, stream demultiplexer,
  output caps);
- :mod:`.connection`: one pinned connection per sandbox (its transport, channels, SFTP session);
- :mod:`.executor`: :class:`SSHExecutor`, what runs on it: commands, streams, file transfer
  (:mod:`.files`: the bounded read exchange and the checks on listed names).

The manager makes one executor per sandbox; the backends never speak SSH.
"""

from .connection import load_private_key, parse_public_key
from .executor import RawResult, SSHExecutor

__all__ = ["RawResult", "SSHExecutor", "load_private_key", "parse_public_key"]
