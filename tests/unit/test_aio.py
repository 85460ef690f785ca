"""``AsyncManager`` / ``AsyncSandbox`` over a fake sync manager: calls run on the manager's own
threads, concurrently, with the sync API's results and errors; ``async with`` destroys."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_rt import (
    AsyncManager,
    ConfigError,
    ExecError,
    ExecResult,
    OutputChunk,
    SandboxError,
    SandboxNotFound,
)


class FakeStream:
    def __init__(self, check: bool) -> None:
        self.check = check
        self.result: ExecResult | None = None

    def __iter__(self) -> Iterator[OutputChunk]:
        yield OutputChunk("stdout", b"1")
        yield OutputChunk("stderr", b"2")
        self.result = ExecResult("s", b"1", b"2", 4, 0.1)
        if self.check:
            raise ExecError("s", 4, b"1", b"2")


class FakeSandbox:
    def __init__(self, mgr: FakeManager, sid: str) -> None:
        self.mgr = mgr
        self.id = sid
        self.destroyed = False

    def exec(self, command: str, **kwargs: Any) -> ExecResult:
        self.mgr.threads.add(threading.current_thread().name)
        if self.mgr.barrier is not None:
            self.mgr.barrier.wait(10)  # every caller must be in here at once
        if command == "boom":
            raise ConfigError("bad command")
        return ExecResult(command, b"out", b"", 0, 0.01)

    def exec_stream(self, command: str, **kwargs: Any) -> FakeStream:
        return FakeStream(kwargs.get("check", False))

    def destroy(self) -> None:
        self.destroyed = True
        self.mgr.destroyed.append(self.id)


class FakeManager:
    def __init__(self) -> None:
        self.threads: set[str] = set()
        self.destroyed: list[str] = []
        self.barrier: threading.Barrier | None = None
        self.n = 0
        self.closed = False

    def create(self, **kwargs: Any) -> FakeSandbox:
        self.n += 1
        return FakeSandbox(self, f"sbx-{self.n:010d}")

    def destroy(self, sandbox_id: str) -> None:
        raise SandboxNotFound(sandbox_id)

    def close(self) -> None:
        self.closed = True


def test_create_exec_stream_and_destroy() -> None:
    fake = FakeManager()

    async def main() -> None:
        async with AsyncManager(fake) as mgr:  # type: ignore[arg-type]
            async with mgr.create(memory_mb=512) as sb:
                r = await sb.exec("echo")
                assert r.stdout == b"out"
                stream = sb.exec_stream("s")
                assert [c async for c in stream] == [OutputChunk("stdout", b"1"), OutputChunk("stderr", b"2")]
                assert stream.result is not None and stream.result.exit_code == 4
                with pytest.raises(ExecError):
                    await sb.exec_stream("s", check=True).wait()
                with pytest.raises(ConfigError, match="bad command"):
                    await sb.exec("boom")
                first = sb.id
            assert fake.destroyed == [first]
            other = await mgr.create()
            await other.destroy()
            with pytest.raises(SandboxNotFound):
                await mgr.destroy("sbx-0000000000")
        assert not fake.closed  # not ours to close

    asyncio.run(main())
    assert fake.threads and all(name.startswith("sandbox-rt-aio") for name in fake.threads)


def test_calls_run_concurrently_on_the_managers_threads() -> None:
    fake = FakeManager()
    fake.barrier = threading.Barrier(8)

    async def main() -> None:
        mgr = AsyncManager(fake, max_workers=8)  # type: ignore[arg-type]
        sb = await mgr.create()
        results = await asyncio.gather(*(sb.exec(f"c{i}") for i in range(8)))
        assert [r.command for r in results] == [f"c{i}" for i in range(8)]
        await mgr.aclose()

    asyncio.run(main())
    assert len(fake.threads) == 8


def test_a_create_is_awaited_once() -> None:
    async def main() -> None:
        mgr = AsyncManager(FakeManager())  # type: ignore[arg-type]
        pending = mgr.create()
        await pending
        with pytest.raises(SandboxError, match="awaited already"):
            await pending
        await mgr.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("workers", [0, -1, True, 5000, 1.5])
def test_max_workers_is_checked(workers: Any) -> None:
    with pytest.raises(ConfigError, match="max_workers"):
        AsyncManager(FakeManager(), max_workers=workers)  # type: ignore[arg-type]
