"""``python -m pve_testserver``: run the PVE API test server in the foreground.

Prints the URL, the CA file and the server certificate's SHA-256 fingerprint; never a secret.
The ``root@pam!bootstrap`` token (privsep=0, all privileges) is written as
``root@pam!bootstrap=<secret>`` to ``--bootstrap-token-file`` (mode 0600). ``--info-file`` gets the
same facts as JSON (url, host, port, fingerprint, ca_file, token_id) for other processes.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from .engine import Engine
from .engine_lxc import DEFAULT_LXC_PATH, DEFAULT_TEMPLATE, LxcEngine
from .engine_memory import MemoryEngine
from .engine_node import NodeEngine
from .schema import Schema, schema_path
from .server import PVETestServer, write_secret


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pve_testserver", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed)")
    ap.add_argument("--state", type=Path, help="JSON state file (loaded if present, written on change)")
    ap.add_argument("--engine", choices=("memory", "lxc", "node"), default="memory")
    ap.add_argument(
        "--node-lxc-path",
        type=Path,
        help="node engine: the LXC path holding the emulated node container (named as the first --nodes)",
    )
    ap.add_argument("--lxc-path", type=Path, default=DEFAULT_LXC_PATH)
    ap.add_argument("--lxc-template", default=DEFAULT_TEMPLATE)
    ap.add_argument("--nodes", default="pve", help="comma-separated node names (first is local)")
    ap.add_argument("--schema", type=Path, default=None, help=f"API schema (default {schema_path()})")
    ap.add_argument("--tls-dir", type=Path, help="where ca.pem/server.pem/server.key go (default: temp dir)")
    ap.add_argument("--bootstrap-token-file", type=Path, help="write root@pam!bootstrap=<secret> here (0600)")
    ap.add_argument("--info-file", type=Path, help="write url/port/fingerprint/ca_file as JSON here")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Handlers first: whoever waits for --info-file may signal us right after it appears.
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    engine: Engine
    nodes = [n for n in args.nodes.split(",") if n]
    if args.engine in ("lxc", "node"):
        if args.engine == "node":
            if args.node_lxc_path is None:
                print("pve-test-server: --engine node needs --node-lxc-path", file=sys.stderr)
                return 2
            engine = NodeEngine(args.node_lxc_path, nodes[0])
        else:
            engine = LxcEngine(args.lxc_path, args.lxc_template)
        reason = engine.unavailable_reason()
        if reason:
            print(f"pve-test-server: {args.engine} engine unavailable: {reason}", file=sys.stderr)
            return 2
    else:
        engine = MemoryEngine()
    # a cluster: every other node runs its CTs in an engine of its own (the LXC engine's containers
    # named pve-<node>-<vmid>); the node engine emulates one node, the others share it
    engines: dict[str, Engine] = {}
    if len(nodes) > 1 and args.engine != "node":
        engines = {nodes[0]: engine}
        for name in nodes[1:]:
            engines[name] = (
                LxcEngine(args.lxc_path, args.lxc_template, prefix=f"pve-{name}-")
                if args.engine == "lxc"
                else MemoryEngine()
            )
    server = PVETestServer(
        host=args.host,
        port=args.port,
        engine=engine,
        engines=engines or None,
        state_file=args.state,
        nodes=nodes,
        schema=Schema.load(args.schema),
        tls_dir=args.tls_dir,
        bootstrap_token_file=args.bootstrap_token_file,
        verbose=args.verbose,
    ).start()
    token_id = server.root_token[0]
    info = {
        "url": server.url,
        "host": server.host,
        "port": server.port,
        "fingerprint": server.fingerprint,
        "ca_file": str(server.ca_file),
        "token_id": token_id,
        "engine": engine.name,
    }
    if args.info_file:
        write_secret(args.info_file, json.dumps(info, indent=1) + "\n")
    print(f"PVE test server ({engine.name} engine) on {server.url}", flush=True)
    print(f"CA file: {server.ca_file}", flush=True)
    print(f"fingerprint (sha256): {server.fingerprint}", flush=True)
    if args.bootstrap_token_file:
        print(f"token {token_id}: secret written to {args.bootstrap_token_file}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
