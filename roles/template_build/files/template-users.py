#!/usr/bin/env python3
"""Print the sandboxes of LXC_PATH that use the template NAME whose rootfs is ROOTFS, one per line.

A sandbox uses it when its config's lxc.rootfs.path names ROOTFS (an overlay clone with the
template's id map) or when its record (sandbox_rt.json, written by the runtime) says its spec's
template is NAME (isolated id maps: the config then names the sandbox's own idmapped mount; a record
written before named templates means "default"). Run by the template_build role before it replaces
a rootfs.
"""

import json
import re
import sys
from pathlib import Path

SANDBOX_ID = re.compile(r"sbx-[0-9a-f]{10}")


def uses(cdir: Path, name: str, rootfs: str) -> bool:
    try:
        config = (cdir / "config").read_text()
    except OSError:
        return False
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "lxc.rootfs.path" and rootfs in value.strip().split(":")[1:]:
            return True
    try:
        record = json.loads((cdir / "sandbox_rt.json").read_text())
        return (record.get("spec") or {}).get("template", "default") == name
    except (OSError, ValueError, AttributeError):
        return False


def main() -> None:
    lxc_path, name, rootfs = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if lxc_path.is_dir():
        for cdir in sorted(lxc_path.iterdir()):
            if SANDBOX_ID.fullmatch(cdir.name) and uses(cdir, name, rootfs):
                print(cdir.name)


main()
