"""Bounds on what the host accepts from a sandbox (what comes out of it), in one place every front door
reads.

Everything a sandbox sends back (command output, file bytes, directory listings, names) is hostile
input: the sandbox may run a lying SSH/SFTP server. These caps bound the host's memory and disk
whatever it sends. Each is a default: the calls that take one (``exec(max_output=)``,
``read_file(max_bytes=)``, ``download(max_bytes=)``) accept another value per call.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_DOWNLOAD_MAX_BYTES",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_READ_MAX_BYTES",
    "DOWNLOAD_MAX_DEPTH",
    "DOWNLOAD_MAX_ENTRIES",
    "FILE_IDLE_TIMEOUT_S",
    "MAX_NAME_BYTES",
    "SFTP_MAX_PACKET",
    "STREAM_QUEUE_CHUNKS",
]

# exec: bytes kept per stream (stdout, stderr); the rest is dropped and the result says so.
DEFAULT_MAX_OUTPUT = 64 << 20
# read_file: the largest file read into memory (its apparent size: a sparse file counts in full).
DEFAULT_READ_MAX_BYTES = 256 << 20
# download: the most bytes one download writes on the host (a file, or all files of a tree).
DEFAULT_DOWNLOAD_MAX_BYTES = 8 << 30
# download of a directory tree: entries listed in all, and directory levels below the top.
DOWNLOAD_MAX_ENTRIES = 100_000
DOWNLOAD_MAX_DEPTH = 64
# a name that comes back from a sandbox (one path component), in UTF-8 bytes (Linux's NAME_MAX).
MAX_NAME_BYTES = 255
# a file read or download that sends nothing for this long has failed (a FIFO swapped in, a mute server).
FILE_IDLE_TIMEOUT_S = 60.0
# the largest SFTP reply accepted (OpenSSH's sftp-server sends at most 256 KiB; a READDIR reply is small).
SFTP_MAX_PACKET = 4 << 20
# exec_stream: output chunks buffered between the SSH reader and a slow consumer; beyond, reading
# pauses, the SSH window closes and the command blocks on its output (bounded memory, no loss).
STREAM_QUEUE_CHUNKS = 64
