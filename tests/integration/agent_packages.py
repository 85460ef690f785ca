"""Tiny packages of the kinds agents install, made on the host for the agent-work tests (issue 17):
a pure-Python wheel with a PEP 503 "simple" index page, an npm package tarball, a git repository
served over dumb HTTP. Built from nothing but the standard library (and git for the repository),
so the tests need no real package index.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

WHEEL_NAME = "sbxdemo"
WHEEL_VERSION = "1.0"
WHEEL_VALUE = "42"
NPM_NAME = "sbx-demo"
NPM_VERSION = "1.0.0"
NPM_VALUE = "43"
GIT_REPO = "demo.git"
GIT_TEXT = "cloned through the egress list"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(directory: Path) -> Path:
    """``sbxdemo-1.0-py3-none-any.whl`` in ``directory``: ``import sbxdemo; sbxdemo.VALUE == 42``."""
    info = f"{WHEEL_NAME}-{WHEEL_VERSION}.dist-info"
    files = {
        f"{WHEEL_NAME}.py": f"VALUE = {WHEEL_VALUE}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_NAME}\nVersion: {WHEEL_VERSION}\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: sandbox_rt-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{WHEEL_NAME}-{WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def make_simple_index(root: Path) -> Path:
    """A PEP 503 index under ``root``: ``simple/sbxdemo/index.html`` linking ``files/<wheel>``."""
    wheel = make_wheel(root / "files")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = root / "simple" / WHEEL_NAME / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        f'<!DOCTYPE html><html><body><a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>'
        "</body></html>\n"
    )
    return root / "simple"


def make_npm_tarball(directory: Path) -> Path:
    """``sbx-demo-1.0.0.tgz`` as ``npm pack`` makes it: ``require('sbx-demo').value === 43``."""
    manifest = {"name": NPM_NAME, "version": NPM_VERSION, "main": "index.js"}
    members = {
        "package/package.json": json.dumps(manifest).encode(),
        "package/index.js": f"module.exports = {{ value: {NPM_VALUE} }};\n".encode(),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{NPM_NAME}-{NPM_VERSION}.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o644
            tar.addfile(member, io.BytesIO(data))
    return path


def make_git_repo(directory: Path) -> Path:
    """A bare repository ``demo.git`` with one commit (``README``), ready for dumb HTTP."""
    work, bare = directory / "demo-work", directory / GIT_REPO
    ident = ["-c", "user.name=sandbox_rt tests", "-c", "user.email=tests@sandbox-rt.invalid"]

    def git(*args: str, cwd: Path = directory) -> None:
        subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True, text=True)

    directory.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "-b", "main", str(work))
    (work / "README").write_text(GIT_TEXT + "\n")
    git("add", "README", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare))
    git("--git-dir", str(bare), "update-server-info")
    return bare


APT_PACKAGE = "sbx-hello"
APT_VERSION = "1.0"
APT_TEXT = "hello from a package"


def make_apt_repo(directory: Path) -> Path:
    """A flat apt repository in ``directory/apt``: one ``sbx-hello`` package (``/usr/bin/sbx-hello``
    prints APT_TEXT), its ``Packages`` index and a ``Release`` file with the index's hashes (no
    signature: the sandbox's source line says ``[trusted=yes]``). Built with dpkg-deb."""
    repo = directory / "apt"
    tree = directory / "apt-build" / APT_PACKAGE
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {APT_PACKAGE}\nVersion: {APT_VERSION}\nArchitecture: all\n"
        "Maintainer: sandbox_rt tests <tests@sandbox-rt.invalid>\nDescription: a test package\n"
    )
    script = tree / "usr" / "bin" / APT_PACKAGE
    script.write_text(f"#!/bin/sh\necho '{APT_TEXT}'\n")
    script.chmod(0o755)
    repo.mkdir(parents=True, exist_ok=True)
    deb = repo / f"{APT_PACKAGE}_{APT_VERSION}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    data = deb.read_bytes()
    control = (tree / "DEBIAN" / "control").read_text()
    packages = (
        control
        + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
        + f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    )
    (repo / "Packages").write_text(packages)
    raw = packages.encode()
    index = f" {hashlib.sha256(raw).hexdigest()} {len(raw)} Packages"
    (repo / "Release").write_text(
        "Origin: sandbox_rt tests\nLabel: sandbox_rt tests\nArchitectures: all amd64\n"
        f"Date: Thu, 01 Jan 2026 00:00:00 UTC\nSHA256:\n{index}\n"
    )
    return repo
