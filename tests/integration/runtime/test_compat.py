"""Compatibility under the sandboxes' kernel confinement (issue 16): every tool the template ships
still does its job in a real sandbox running the seccomp profile, no_new_privs and the user
namespace lock, on both backends (embedded LXC and PVE-backed through the test server).

One shared sandbox per backend; each tool is one line of TOOLS: a shell command run as the sandbox
user and a regular expression its whole stdout must match (exit code 0). A tool the template gains
(issue 17: git, gcc + make, node/npm, venv + pip) is one more line. The network
part stays inside the sandbox's own network namespace (an HTTP server on its loopback and on its
own address): nothing leaves the machine.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox_rt
from sandbox_rt import Manager
from tests.integration import agent_packages as pkgs

from .conftest import SESSION_LABEL

PY_THREADS = """
import concurrent.futures, threading
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    squares = list(pool.map(lambda n: n * n, range(100)))
lock, seen = threading.Lock(), []
def add(n):
    with lock:
        seen.append(n)
threads = [threading.Thread(target=add, args=(n,)) for n in range(16)]
[t.start() for t in threads]; [t.join() for t in threads]
print(sum(squares), len(seen))
"""
PY_MULTIPROCESSING = """
import multiprocessing as mp
def square(n):
    return n * n
if __name__ == "__main__":
    for method in ("fork", "spawn", "forkserver"):
        ctx = mp.get_context(method)
        with ctx.Pool(2) as pool:
            total = sum(pool.map(square, range(10)))
        queue = ctx.Queue()
        proc = ctx.Process(target=queue.put, args=(method,))
        proc.start(); got = queue.get(timeout=30); proc.join()
        print(method, total, got, proc.exitcode)
"""
PY_ASYNCIO = """
import asyncio
async def echo(reader, writer):
    writer.write(await reader.readline()); await writer.drain(); writer.close()
async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping\\n"); await writer.drain()
    line = await reader.readline()
    proc = await asyncio.create_subprocess_exec("echo", "child", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    slept = await asyncio.gather(*(asyncio.sleep(0.01, result=i) for i in range(5)))
    server.close(); await server.wait_closed()
    print(line.decode().strip(), out.decode().strip(), sum(slept))
asyncio.run(main())
"""
PY_SUBPROCESS = """
import os, subprocess, sys
out = subprocess.run(["sh", "-c", "echo $0", "x"], capture_output=True, text=True, check=True).stdout
with subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as p:
    piped = p.communicate(b"piped")[0].decode()
pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
code = os.waitpid(pid, 0)[1]
print(out.strip(), piped, code, subprocess.call([sys.executable, "-c", "raise SystemExit(3)"]))
"""
PY_STDLIB = """
import hashlib, mmap, os, select, signal, socket, sqlite3, ssl, tempfile, zlib
db = sqlite3.connect(":memory:"); db.execute("create table t (x)"); db.execute("insert into t values (7)")
ctx = ssl.create_default_context()
a, b = socket.socketpair(); a.sendall(b"x"); ep = select.epoll(); ep.register(b, select.EPOLLIN)
with tempfile.TemporaryFile() as f:
    f.write(b"m" * 4096); f.flush(); mapped = mmap.mmap(f.fileno(), 4096)[:1]
signal.signal(signal.SIGALRM, lambda *_: None); signal.setitimer(signal.ITIMER_REAL, 0.01); signal.pause()
print(db.execute("select x from t").fetchone()[0], ctx.verify_mode == ssl.CERT_REQUIRED, len(ep.poll(1)),
      mapped.decode(), len(zlib.compress(b"z" * 1000)) < 100, hashlib.sha256(b"").hexdigest()[:8],
      os.cpu_count() > 0)
"""
# an HTTP server on the sandbox's loopback and its own address, polled until it answers, then curl
CURL = r"""
cd /etc && python3 -m http.server --bind 0.0.0.0 8765 >/dev/null 2>&1 & srv=$!
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8765/ && break; sleep 0.05; done
own=$(ip -o -4 addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
curl -sS --max-time 10 http://127.0.0.1:8765/hostname >/dev/null && curl -sS --max-time 10 -o /dev/null \
  -w '%{http_code}\n' "http://$own:8765/os-release"; kill $srv
"""

C_SOURCE = '#include <stdio.h>\nint main(void) { printf("%d\\n", 6 * 7); return 0; }\n'
MAKEFILE = "h: h.c\n\tcc -O2 -Wall -o h h.c\n"
CXX_SOURCE = (
    "#include <iostream>\n#include <vector>\n"
    'int main() { std::vector<int> v{3, 4}; std::cout << "cxx " << v[0] + v[1] << std::endl; }\n'
)
# a local repository committed to and cloned (the identity only for this commit)
GIT = (
    'd=$(mktemp -d) && git init -q -b main "$d/src" && '
    'git -C "$d/src" -c user.name=a -c user.email=a@b.invalid commit -q --allow-empty -m first && '
    'git clone -q "$d/src" "$d/dst" && git -C "$d/dst" log --format=%s'
)
# a package packed by npm and installed from its tarball, offline
NPM_PACK = (
    'd=$(mktemp -d) && mkdir "$d/pkg" "$d/app" && cd "$d/pkg" && '
    """printf '{"name": "pkg", "version": "1.0.0", "main": "index.js"}' > package.json && """
    "printf 'module.exports = { value: 44 };' > index.js && npm pack --silent >/dev/null && "
    'cd "$d/app" && npm install --offline --no-audit --no-fund --loglevel=error '
    '"$d/pkg/pkg-1.0.0.tgz" >/dev/null && '
    "node -e \"console.log('pkg', require('pkg').value)\""
)

TOOLS: dict[str, tuple[str, str]] = {
    "bash": (
        "bash -c 'a=(x y z); f() { echo ${#a[@]}:$((6 * 7)); }; f; echo $(echo sub) | cat'",
        r"3:42\nsub\n",
    ),
    "bash jobs": ("bash -c 'sleep 0.05 & sleep 0.05 & wait; (exit 3); echo $?; echo done'", r"3\ndone\n"),
    "sh pipes": ("printf 'b\\na\\n' | sort | head -n1 && echo x 2>&1 >/dev/null | wc -l", r"a\n0\n"),
    "setsid": ("setsid -w sh -c 'ps -o sid= -p $$; echo $$'", r"\s*(\d+)\n\1\n"),
    "timeout": ("timeout 0.2 sleep 5; echo $?", r"124\n"),
    "coreutils": (
        "d=$(mktemp -d) && cp /etc/hostname $d/a && mv $d/a $d/b && ln -s b $d/l && readlink $d/l && "
        "echo x | sha256sum | cut -c1-8 && dd if=/dev/zero of=$d/z bs=4k count=4 status=none && "
        "stat -c %s $d/z && rm -r $d && nproc >/dev/null && echo ok",
        r"b\n[0-9a-f]{8}\n16384\nok\n",
    ),
    "find xargs sed awk grep": (
        "find /etc -maxdepth 1 -name 'host*' | sort | xargs -n1 basename | sed 's/^/x-/' "
        "| awk '{print toupper($0)}' | grep -c '^X-HOST'",
        r"[1-9]\d*\n",
    ),
    "tar gzip": ("tar czf /tmp/t.tgz -C /etc hostname && tar tzf /tmp/t.tgz && rm /tmp/t.tgz", r"hostname\n"),
    "ps": ("ps -o comm= -p 1 && ps -eo pid= | wc -l", r"tini\n\d+\n"),
    "procps free top": (
        "free -m | head -n1 | awk '{print $1}' && top -bn1 | head -n1 | cut -c1-3",
        r"total\ntop\n",
    ),
    "iproute2": ("ip -o -4 addr show dev eth0 | awk '{print $3}'", r"inet\n"),
    "getent": ("getent passwd sandbox | cut -d: -f1,3", r"sandbox:1000\n"),
    "flock": ("flock /tmp/.compat-lock -c 'echo locked'", r"locked\n"),
    "ssh-keygen": (
        "ssh-keygen -q -t ed25519 -N '' -f /tmp/k && ssh-keygen -l -f /tmp/k.pub | cut -d' ' -f1 "
        "&& rm /tmp/k*",
        r"256\n",
    ),
    "dpkg": ("dpkg-query -W -f='${Status}\\n' coreutils python3", r"(install ok installed\n){2}"),
    "python3 threads": (f"python3 -c {shlex.quote(PY_THREADS)}", r"328350 16\n"),
    "python3 multiprocessing": (  # a file: spawn and forkserver children import __main__ from it
        f'cd "$(mktemp -d)" && printf %s {shlex.quote(PY_MULTIPROCESSING)} > mp.py && python3 mp.py',
        r"fork 285 fork 0\nspawn 285 spawn 0\nforkserver 285 forkserver 0\n",
    ),
    "python3 asyncio": (f"python3 -c {shlex.quote(PY_ASYNCIO)}", r"ping child 10\n"),
    "python3 subprocess": (f"python3 -c {shlex.quote(PY_SUBPROCESS)}", r"x piped 0 3\n"),
    "python3 stdlib": (f"python3 -c {shlex.quote(PY_STDLIB)}", r"7 True 1 m True e3b0c442 True\n"),
    "curl": (CURL, r"200\n"),
    # the agent tools of the default template (issue 17; network side: tests/hardening/test_agent_work.py)
    "gcc make": (
        f'cd "$(mktemp -d)" && printf %s {shlex.quote(C_SOURCE)} > h.c && '
        f"printf %s {shlex.quote(MAKEFILE)} > Makefile && make -s && ./h",
        r"42\n",
    ),
    "g++": (
        f'cd "$(mktemp -d)" && printf %s {shlex.quote(CXX_SOURCE)} > h.cc && g++ -O1 -o h h.cc && ./h',
        r"cxx 7\n",
    ),
    "git": (GIT, r"first\n"),
    "node": ("node -e 'console.log([1, 2, 3].map((x) => x * 2).join(\",\"))'", r"2,4,6\n"),
    "npm pack install": (NPM_PACK, r"pkg 44\n"),
    "python3 venv pip": (
        'd=$(mktemp -d) && python3 -m venv "$d/v" && "$d/v/bin/pip" --version | cut -d" " -f1 && '
        '"$d/v/bin/python" -c "import sys; print(sys.prefix != sys.base_prefix)"',
        r"pip\nTrue\n",
    ),
    "jq": ("""echo '{"x": [1, 2]}' | jq -c '.x | map(. * 3)'""", r"\[3,6\]\n"),
    "unzip tree": (
        'cd "$(mktemp -d)" && python3 -m zipfile -c z.zip /etc/hostname && unzip -q z.zip && '
        "tree -i --noreport .",
        r"\.\nhostname\nz\.zip\n",
    ),
}


@pytest.fixture(scope="module")
def compat_sandbox(manager: Manager) -> Iterator[sandbox_rt.Sandbox]:
    """One sandbox per backend for the whole module (the tools change nothing that matters)."""
    sb = manager.create(memory_mb=1024, labels=SESSION_LABEL)
    try:
        yield sb
    finally:
        sb.destroy()


def test_the_sandbox_runs_confined(compat_sandbox: sandbox_rt.Sandbox) -> None:
    """The compatibility below means something: the profile, no_new_privs and the lock are on."""
    r = compat_sandbox.exec(
        "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; cat /proc/sys/user/max_user_namespaces; "
        "unshare -Ur true 2>&1; python3 -c 'import ctypes; print(ctypes.CDLL(None).syscall(250, 0, -3, 0))'",
        timeout=30,
    )
    lines = r.text.splitlines()
    assert lines[:3] == ["NoNewPrivs:\t1", "Seccomp:\t2", "0"], lines  # /proc/self/status order
    assert "Operation not permitted" in lines[3], lines  # unshare: the filter's EPERM
    assert lines[4] == "-1", lines  # keyctl refused


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_tool_works_under_the_profile(compat_sandbox: sandbox_rt.Sandbox, tool: str) -> None:
    command, expected = TOOLS[tool]
    r = compat_sandbox.exec(command, timeout=120)
    assert r.exit_code == 0, f"{tool}: exit {r.exit_code}\n{r.stderr_text[-2000:]}"
    assert re.fullmatch(expected, r.text), (
        f"{tool}: {r.text!r} does not match {expected!r}\n{r.stderr_text[-2000:]}"
    )


def test_pip_installs_a_local_wheel_for_the_user(compat_sandbox: sandbox_rt.Sandbox, tmp_path: Path) -> None:
    """README's ``pip install --user`` outside a venv works (Debian's PEP 668 refusal is lifted by the
    template's /etc/pip.conf), from a wheel made on the host and uploaded: no index needed."""
    wheel = pkgs.make_wheel(tmp_path)
    remote = f"/tmp/wheels/{wheel.name}"
    compat_sandbox.upload(wheel, remote)
    r = compat_sandbox.exec(
        f"pip install --user --no-index {remote} && python3 -c 'import sbxdemo; print(sbxdemo.VALUE)' && "
        "python3 -c 'import sbxdemo, site; print(sbxdemo.__file__.startswith(site.getusersitepackages()))'",
        timeout=120,
    )
    assert r.exit_code == 0, r.stderr_text[-2000:]
    assert r.text.splitlines()[-2:] == [pkgs.WHEEL_VALUE, "True"], r.text
