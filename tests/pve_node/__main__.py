"""``python -m tests.pve_node start|status|reboot|stop|env`` (root): the emulated PVE node.

start   build (cached) and boot the node container, wire it, start its PVE API test server
        (--no-api: not the server). SANDBOX_RT_PVE_NODE_INDEX=N picks node N (default 0): nodes
        with different indexes have different names, interfaces and networks
status  print the node's facts as JSON (exit 1 when it is not running)
reboot  stop and start the node container (its disk stays; nothing is re-provisioned)
stop    remove the node, its API server and its wiring (leaves nothing but the tarball cache)
env     print the shell exports that point Ansible and the runtime at the node
provision  start, then `ansible-playbook -i inventories/pve_emulated site.yml [ARGS...]` with the
        node's environment (one command from nothing to a provisioned node)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from .node import REPO, PVENode
from .spec import spec_from_env


def exports(node: PVENode) -> dict[str, str]:
    """What ``ansible-playbook -i inventories/pve_emulated`` and the runtime need in the environment."""
    spec = node.spec
    return {
        "SANDBOX_RT_PVE_NODE_DIR": str(spec.home),
        # Ansible's proxmox_pct_remote connection reads ~/.ssh/known_hosts only: this HOME holds the
        # node's pinned key there (and Ansible's scratch directories).
        "HOME": str(spec.ansible_home),
        # The runtime's host contract written by site.yml for this node (sandbox_runtime role).
        "SANDBOX_RT_CONFIG": str(spec.home / "controller" / "host.json"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.pve_node", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("start", "status", "reboot", "stop", "env", "provision"))
    ap.add_argument("--no-api", action="store_true", help="start: the node only, not its PVE API test server")
    ap.add_argument("playbook_args", nargs="*", help="provision: extra ansible-playbook arguments (after --)")
    args = ap.parse_args(argv)
    node = PVENode(spec_from_env())
    if args.action == "start":
        node.start()
        if not args.no_api:
            node.api_start()
        print(json.dumps(node.info(), indent=1))
    elif args.action == "provision":
        node.start()
        node.api_start()
        playbook = [
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            "inventories/pve_emulated",
            "site.yml",
        ]
        return subprocess.run(
            [*playbook, *args.playbook_args], cwd=REPO, env={**os.environ, **exports(node)}
        ).returncode
    elif args.action == "reboot":
        node.reboot()
        print(json.dumps(node.info(), indent=1))
    elif args.action == "stop":
        removed = node.stop()
        left = node.leftovers()
        print("removed: " + (", ".join(removed) or "nothing"))
        if left:
            print("LEFT BEHIND: " + ", ".join(left), file=sys.stderr)
            return 1
    elif args.action == "env":
        for key, value in exports(node).items():
            print(f"export {key}={shlex.quote(value)}")
    else:
        info = node.info() | {"api_running": node.api_running()}
        print(json.dumps(info, indent=1))
        return 0 if info["running"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
