"""``sandbox-rt``: run a command in a fresh sandbox, or manage sandboxes by id.

Progress goes to stderr (``-q`` silences it); ``--json`` prints machine-readable results on stdout.
Exit codes: the command's own for ``run``/``exec``; 2 bad usage or input; 1 any other error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, logs
from .cli_template import add_template_command, template_command
from .cli_volumes import add_volume_command, parse_volume_flags, volume_command
from .config import Settings
from .errors import ConfigError, SandboxError
from .manager import Manager
from .models import SandboxRecord
from .options import door_options
from .policy import DoorPolicy
from .sandbox import Sandbox
from .web.limits import HTTP_LIMITS

__all__ = ["main"]


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc


def _labels(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"label {item!r} must be KEY=VALUE")
        out[key] = value
    return out


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says what it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def _common_options(*, after_command: bool) -> argparse.ArgumentParser:
    """-q, --json and --log-format: before the command or after it (``sandbox-rt ls --json``).
    After it they default to "not given", so they never undo the same flag given before."""
    common = argparse.ArgumentParser(add_help=False)
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if after_command else {}
    common.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr", **unset)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout", **unset)
    common.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="how the runtime's log records look on stderr (json: one object per line, with the "
        "event and sandbox id as fields; progress lines are then left out)",
        **(unset or {"default": "text"}),
    )
    common.add_argument(
        "--log-file",
        metavar="PATH",
        help="append the log records to PATH instead of stderr (reopened when logrotate moves it; "
        "env SANDBOX_RT_LOG_FILE)",
        **(unset or {"default": os.environ.get("SANDBOX_RT_LOG_FILE") or None}),
    )
    return common


# how a flag of each kind of create option is read (sandbox_rt.options.Kind)
_FLAG_KINDS: dict[str, dict[str, Any]] = {
    "string": {},
    "number": {"type": _positive_float},
    "integer": {"type": int},
    "boolean": {"action": "store_true"},
    "string_list": {"action": "append", "default": []},
    "string_map": {"action": "append", "default": []},
    "mounts": {"action": "append", "default": []},
}
# a repeated flag's values as the option's value
_FLAG_VALUES: dict[str, Callable[[Sequence[str]], Any]] = {
    "string_map": _labels,
    "mounts": parse_volume_flags,
}


def add_create_flags(sp: argparse.ArgumentParser) -> None:
    """``run``'s and ``create``'s flags: one per create option the CLI takes (sandbox_rt.options)."""
    for opt in door_options("cli"):
        how = {"default": opt.default, "metavar": opt.metavar, **_FLAG_KINDS[opt.kind]}
        if how.get("action") == "store_true":
            how.pop("metavar")
        sp.add_argument(opt.cli_flag, dest=opt.name, help=opt.help, **how)


def create_options(args: argparse.Namespace) -> dict[str, Any]:
    """The create options given on the command line (left out: the declared defaults)."""
    given = {}
    for opt in door_options("cli"):
        value = getattr(args, opt.name)
        given[opt.name] = _FLAG_VALUES[opt.kind](value) if opt.kind in _FLAG_VALUES else value
    return given


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sandbox-rt",
        description=__doc__.splitlines()[0],
        parents=[_common_options(after_command=False)],
        formatter_class=_Formatter,
    )
    p.add_argument("--version", action="version", version=f"sandbox-rt {__version__}")
    commands = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    after = _common_options(after_command=True)

    # every command takes the common options and shows its options' defaults
    command = functools.partial(commands.add_parser, parents=[after], formatter_class=_Formatter)

    run = command("run", help="create a sandbox, run CMD (streaming), destroy it")
    add_create_flags(run)
    run.add_argument("--timeout", type=_positive_float, help="command timeout in seconds")
    run.add_argument("--user", help="run CMD as this user: root needs --root (default: the sandbox user)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")

    create = command("create", help="create a sandbox and print its id")
    add_create_flags(create)

    ex = command("exec", help="run CMD in an existing sandbox")
    ex.add_argument("id")
    ex.add_argument(
        "--timeout", type=_positive_float, help="command timeout in seconds (default: the host's)"
    )
    ex.add_argument("--user", help="root: in a sandbox made with --root (default: the sandbox user)")
    ex.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD")

    sh = command("shell", help="an interactive shell in a sandbox, in this terminal")
    sh.add_argument("id")
    sh.add_argument("--command", help="run this instead of the login shell")
    sh.add_argument("--user", help="root: in a sandbox made with --root (default: the sandbox user)")

    xt = command("extend", help="let a sandbox live SECONDS from now (its TTL)")
    xt.add_argument("id")
    xt.add_argument("seconds", type=int, metavar="SECONDS")

    sn = command("snapshot", help="save a sandbox's files as a named snapshot (to fork)")
    sn.add_argument("id")
    sn.add_argument("name")
    command("snapshots", help="list snapshots")
    add_template_command(command)
    add_volume_command(command)
    ds = command("delete-snapshot", help="delete snapshots by name")
    ds.add_argument("names", nargs="+", metavar="NAME")

    ls = command("ls", help="list sandboxes")
    ls.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only those with it (repeatable)",
    )

    st = command("status", help="state, limits and usage of a sandbox")
    st.add_argument("id")

    de = command("destroy", help="destroy sandboxes by id")
    de.add_argument("ids", nargs="+", metavar="ID")

    gc = command("gc", help="remove half-made, expired (and with --dead-owners orphaned) sandboxes")
    gc.add_argument("--dead-owners", action="store_true", help="also those whose creating process died")
    gc.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")

    sv = command("serve", help="the HTTP control API (bearer token; loopback by default)")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    sv.add_argument("--port", type=int, default=8787, help="the port to listen on")
    sv.add_argument("--token-file", help="file with the bearer token, mode 0600 (else $SANDBOX_RT_API_TOKEN)")
    sv.add_argument(
        "--opensandbox-port",
        type=int,
        metavar="PORT",
        help="also serve the OpenSandbox dialect (lifecycle + execd) on this port, same host and token",
    )
    sv.add_argument(
        "--allow-host-path",
        action="append",
        default=[],
        metavar="DIR",
        help="sandboxes may mount host directories under DIR (repeatable; beside host.json's "
        "volume_host_dirs)",
    )
    sv.add_argument(
        "--max-body-mb",
        type=int,
        default=HTTP_LIMITS.max_body_bytes >> 20,
        metavar="MB",
        help="largest request body with a valid token (default: %(default)s)",
    )
    sv.add_argument(
        "--max-connections",
        type=int,
        default=HTTP_LIMITS.max_connections,
        metavar="N",
        help="open connections at most; when all are open, the oldest without a valid token gives way "
        "to a new one (default: %(default)s)",
    )
    sv.add_argument(
        "--header-timeout",
        type=_positive_float,
        default=HTTP_LIMITS.header_timeout_s,
        metavar="SECONDS",
        help="a request's head (and a body without a valid token) must arrive within this "
        "(default: %(default)s)",
    )
    sv.add_argument(
        "--idle-timeout",
        type=_positive_float,
        default=HTTP_LIMITS.idle_timeout_s,
        metavar="SECONDS",
        help="close a keep-alive connection idle for this long (default: %(default)s)",
    )
    _policy_args(sv)

    _mcp_args(command("mcp", help="an MCP server: sandboxes as tools (stdio, or HTTP with a token)"))

    rp = command("reaper", help="destroy expired sandboxes and those whose owner died, every N s")
    rp.add_argument(
        "--interval", type=_positive_float, default=30.0, metavar="SECONDS", help="between sweeps"
    )
    rp.add_argument("--once", action="store_true", help="one sweep (e.g. from cron), then exit")
    return p


def _policy_args(door: argparse.ArgumentParser) -> None:
    """What the clients of ``serve`` and ``mcp`` may ask of create (sandbox_rt/policy.py)."""
    door.add_argument("--allow-root", action="store_true", help="clients may create sandboxes with root")
    door.add_argument(
        "--allow-uncapped",
        action="store_true",
        help="clients may switch a cap off (0) or raise it above the host's default",
    )


def _mcp_args(mc: argparse.ArgumentParser) -> None:
    """``sandbox-rt mcp`` (sandbox_rt/mcp/server.py)."""
    mc.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="how clients reach it")
    mc.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    mc.add_argument("--port", type=int, default=8788, help="http: the port (0: a free one)")
    mc.add_argument("--token-file", help="http: the bearer token's file, 0600 (else $SANDBOX_RT_API_TOKEN)")
    mc.add_argument("--ttl", type=int, default=3600, metavar="SECONDS", help="a sandbox's TTL unless asked")
    mc.add_argument("--max-ttl", type=int, default=86400, metavar="SECONDS", help="the longest TTL given")
    mc.add_argument("--max-sandboxes", type=int, default=8, metavar="N", help="sandboxes per session at once")
    mc.add_argument(
        "--max-output", type=int, default=64 << 10, metavar="BYTES", help="output shown per stream"
    )
    mc.add_argument("--keep-snapshots", action="store_true", help="keep a session's snapshots after it ends")
    mc.add_argument(
        "--base-snapshot",
        action="append",
        default=[],
        metavar="NAME",
        help="a snapshot any session may fork",
    )
    mc.add_argument(
        "--session-idle",
        type=_positive_float,
        default=1800.0,
        metavar="SECONDS",
        help="http: end an idle session",
    )
    _policy_args(mc)


def _command(words: Sequence[str]) -> list[str]:
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ConfigError("no command given (usage: ... -- CMD [ARG ...])")
    return words


def _cmd_text(words: list[str]) -> str | list[str]:
    """One word runs as shell text (``"echo $HOME"``); several are an exact argv."""
    return words[0] if len(words) == 1 else words


def _record_json(r: SandboxRecord) -> dict[str, Any]:
    data = dataclasses.asdict(r)
    data.pop("host_key", None)
    return data


class _Cli:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()

    def progress(self, msg: str) -> None:
        if not self.args.quiet and self.args.log_format != "json":
            print(f"[{time.monotonic() - self.started:6.2f}s] {msg}", file=sys.stderr, flush=True)

    def out(self, data: Any, text: str) -> None:
        print(json.dumps(data, indent=1, default=str) if self.args.json else text, flush=True)

    def _stream(self, sb: Sandbox, words: list[str], timeout: float | None) -> int:
        stream = sb.exec_stream(_cmd_text(words), timeout=timeout, user=self.args.user)
        if self.args.json:
            result = stream.wait()
            self.out(
                {
                    "id": sb.id,
                    "exit_code": result.exit_code,
                    "stdout": result.text,
                    "stderr": result.stderr_text,
                    "duration_s": result.duration_s,
                },
                "",
            )
            return result.exit_code
        for chunk in stream:
            target = sys.stdout.buffer if chunk.stream == "stdout" else sys.stderr.buffer
            target.write(chunk.data)
            target.flush()
        assert stream.result is not None
        return stream.result.exit_code

    def _create(self, mgr: Manager, *, detached: bool = False) -> Sandbox:
        options = create_options(self.args)
        return mgr.create(detached=detached, progress=self.progress, **options)

    def run(self) -> int:
        a = self.args
        # the long-running commands always say what they do; the others when asked for JSON records
        if a.log_format == "json" or a.log_file or a.cmd in ("serve", "mcp", "reaper"):
            logs.configure(a.log_format, level=logging.WARNING if a.quiet else logging.INFO, file=a.log_file)
        if a.cmd in ("run", "exec"):
            words = _command(a.command)  # bad usage fails before any sandbox is made
        if a.cmd == "serve":
            return self.serve()
        if a.cmd == "mcp":
            return self.mcp()
        mgr = Manager.from_env()
        if a.cmd == "run":
            with self._create(mgr) as sb:
                code = self._stream(sb, words, a.timeout)
                self.progress(f"destroying {sb.id}")
            self.progress("done")
            return code
        if a.cmd == "create":
            sb = self._create(mgr, detached=True)  # outlives this command; its TTL ends it
            sb.close()
            self.out(_record_json(sb.record), sb.id)
            return 0
        if a.cmd == "exec":
            sb = mgr.attach(a.id)
            try:
                return self._stream(sb, words, a.timeout)
            finally:
                sb.close()
        if a.cmd == "shell":
            from .terminal import attach_terminal, local_size

            sb = mgr.attach(a.id)
            try:
                cols, rows = local_size()
                with sb.pty(cols, rows, command=a.command, user=a.user) as term:
                    return attach_terminal(term)
            finally:
                sb.close()
        if a.cmd == "extend":
            sb = mgr.attach(a.id)
            try:
                sb.extend(a.seconds)
            finally:
                sb.close()
            expires = sb.record.expires_at or 0.0
            text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires))
            self.out({"id": sb.id, "expires_at": expires}, f"{sb.id} expires at {text}")
            return 0
        if a.cmd == "snapshot":
            info = mgr.snapshot(a.id, a.name)
            self.out(dataclasses.asdict(info), info.name)
            return 0
        if a.cmd == "snapshots":
            snaps = mgr.list_snapshots()
            lines = [f"{'NAME':40} {'SOURCE':16} {'CREATED':20} SIZE"]
            for sn in snaps:
                created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(sn.created_at))
                size = f"{sn.size_bytes / 1e6:.1f} MB" if sn.size_bytes is not None else "-"
                lines.append(f"{sn.name:40} {sn.source_id:16} {created:20} {size}")
            self.out([dataclasses.asdict(sn) for sn in snaps], "\n".join(lines))
            return 0
        if a.cmd == "template":
            return template_command(a, mgr, self.out, self.progress)
        if a.cmd == "volume":
            return volume_command(a, mgr, self.out)
        if a.cmd == "delete-snapshot":
            for name in a.names:
                mgr.delete_snapshot(name)
                self.progress(f"deleted snapshot {name}")
            self.out({"deleted": a.names}, "")
            return 0
        if a.cmd == "ls":
            records = mgr.list(labels=_labels(a.label))
            lines = [f"{'ID':16} {'IP':15} {'HOSTNAME':20} {'EXPIRES':20} LABELS"]
            for r in records:
                exp = (
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.expires_at)) if r.expires_at else "-"
                )
                labels = ",".join(f"{k}={v}" for k, v in sorted(r.spec.labels.items()))
                lines.append(f"{r.id:16} {r.ip:15} {r.hostname:20} {exp:20} {labels}")
            self.out([_record_json(r) for r in records], "\n".join(lines))
            return 0
        if a.cmd == "status":
            sb = mgr.attach(a.id)
            try:
                status = dataclasses.asdict(sb.status())
            finally:
                sb.close()
            self.out(status, "\n".join(f"{k}: {v}" for k, v in status.items()))
            return 0
        if a.cmd == "destroy":
            for sid in a.ids:
                mgr.destroy(sid)
                self.progress(f"destroyed {sid}")
            self.out({"destroyed": a.ids}, "")
            return 0
        if a.cmd == "gc":
            removed = mgr.gc(dead_owners=a.dead_owners, dry_run=a.dry_run)
            pruned = mgr.prune_templates(dry_run=a.dry_run)
            verb = "would remove" if a.dry_run else "removed"
            lines = [f"{verb} {r.sandbox_id}: {r.reason}" for r in removed]
            lines += [f"{verb} template generation {c}: unused" for c in pruned]
            self.out(
                [dataclasses.asdict(r) for r in removed]
                + [{"template_container": c, "reason": "unused template generation"} for c in pruned],
                "\n".join(lines) or "nothing to collect",
            )
            return 0
        if a.cmd == "reaper":
            while True:
                for reaped in mgr.gc(dead_owners=True):
                    print(f"reaped {reaped.sandbox_id}: {reaped.reason}", flush=True)
                for container in mgr.prune_templates():
                    print(f"removed template generation {container}: unused", flush=True)
                if a.once:
                    return 0
                time.sleep(a.interval)  # the reaper's period
        raise ConfigError(f"unknown command {a.cmd!r}")

    def serve(self) -> int:
        from .web.server import load_token, serve

        a = self.args
        # a missing, weak or unsafe token, or a bad limit, is a usage error before anything starts
        token = load_token(a.token_file)
        if a.max_body_mb < 1:
            raise ConfigError(f"--max-body-mb {a.max_body_mb} must be at least 1")
        limits = dataclasses.replace(
            HTTP_LIMITS,
            max_body_bytes=a.max_body_mb << 20,
            max_connections=a.max_connections,
            header_timeout_s=a.header_timeout,
            idle_timeout_s=a.idle_timeout,
        )
        settings = Settings.load()
        if a.allow_host_path:  # host directories sandboxes may mount, beside host.json's
            allowed = [*settings.volume_host_dirs, *a.allow_host_path]
            settings = dataclasses.replace(settings, volume_host_dirs=allowed)
        mgr = Manager(settings)
        serve(
            mgr,
            a.host,
            a.port,
            token=token,
            limits=limits,
            opensandbox_port=a.opensandbox_port,
            policy=self._policy(mgr, "sandbox-rt serve"),
            on_ready=lambda url: self.progress(f"listening on {url}"),
        )
        return 0

    def _policy(self, mgr: Manager, door: str) -> DoorPolicy:
        a = self.args
        if a.allow_root or a.allow_uncapped:  # the operator widened what agents may ask: say so
            logging.getLogger(__name__).warning(
                "%s: clients may create root sandboxes: %s, uncapped ones: %s",
                door,
                a.allow_root,
                a.allow_uncapped,
            )
        return DoorPolicy.of(mgr, door=door, allow_root=a.allow_root, allow_uncapped=a.allow_uncapped)

    def mcp(self) -> int:
        from .mcp.server import McpOptions, SandboxMcp
        from .mcp.transport import serve_http, serve_stdio
        from .web.server import load_token

        a = self.args
        options = McpOptions(  # bad options and a missing or unsafe token fail before anything starts
            default_ttl_s=a.ttl,
            max_ttl_s=a.max_ttl,
            max_sandboxes=a.max_sandboxes,
            max_output=a.max_output,
            max_output_limit=max(a.max_output, McpOptions.max_output_limit),
            keep_snapshots=a.keep_snapshots,
            base_snapshots=tuple(a.base_snapshot),
            session_idle_s=a.session_idle,
        )
        token = load_token(a.token_file) if a.transport == "http" else None
        mgr = Manager.from_env()
        mcp = SandboxMcp(mgr, options, self._policy(mgr, "sandbox-rt mcp"))
        if token is None:
            serve_stdio(mcp)  # stdout carries the protocol: progress and logs go to stderr
        else:

            def ready(url: str) -> None:
                self.progress(f"MCP on {url}")

            serve_http(mcp, token=token, host=a.host, port=a.port, on_ready=ready)
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _Cli(args).run()
    except ConfigError as exc:
        print(f"sandbox-rt: error: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"sandbox-rt: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sandbox-rt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
