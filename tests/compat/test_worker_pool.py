"""The prefork supervisor with stand-in children (no database): readiness, signals,
replacement of dead children, and exit 1 when a child exits 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest

from akadze_compat.worker_pool import Supervisor

# argv[1]: the ready fd; argv[2]: what to do once ready.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    fd, then = int(sys.argv[1]), sys.argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if then == "fail-early":
        sys.exit(1)
    os.write(fd, f"{os.getpid()}\\n".encode())
    if then == "fail":
        time.sleep(0.3)
        sys.exit(1)
    if then == "die":
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)
""")


class Children:
    """A ``spawn`` for the supervisor: child ``number`` behaves as ``plan(number)`` says;
    once ``stop_after`` children were started, SIGTERM is sent to this process."""

    def __init__(self, plan: Callable[[int], str], stop_after: int | None = None) -> None:
        self.plan = plan
        self.stop_after = stop_after
        self.started: list[subprocess.Popen[bytes]] = []

    def __call__(self, number: int, ready_fd: int) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", CHILD, str(ready_fd),
                                    self.plan(number)], pass_fds=(ready_fd,))
        self.started.append(process)
        return process

    def stop_when_ready(self) -> None:
        if self.stop_after is None or len(self.started) >= self.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(autouse=True)
def _restore_sigterm() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_ready_once_then_a_warm_stop_exits_0() -> None:
    children = Children(lambda number: "wait")
    events: list[tuple[str, ...]] = []

    def ready() -> None:
        events.append(("ready",))
        children.stop_when_ready()

    supervisor = Supervisor(3, children, on_ready=ready,
                            on_stopping=lambda sig, how: events.append((sig, how)))
    assert supervisor.run() == 0
    assert events == [("ready",), ("SIGTERM", "Warm")]
    assert len(children.started) == 3
    assert all(process.returncode == 0 for process in children.started)


def test_a_child_that_exits_1_stops_the_pool_with_1() -> None:
    children = Children(lambda number: "fail" if number == 2 else "wait")
    assert Supervisor(2, children).run() == 1
    assert [process.returncode for process in children.started] == [0, 1]


def test_a_first_child_failing_at_start_is_the_only_one() -> None:
    children = Children(lambda number: "fail-early")
    assert Supervisor(4, children).run() == 1
    assert len(children.started) == 1


def test_a_killed_child_is_replaced() -> None:
    children = Children(lambda number: "die" if number == 1 else "wait", stop_after=3)
    replaced: list[int] = []

    def spawn(number: int, ready_fd: int) -> subprocess.Popen[bytes]:
        process = children(number, ready_fd)
        if number == 3:
            replaced.append(number)
            children.stop_when_ready()
        return process

    assert Supervisor(2, spawn).run() == 0
    assert replaced == [3]
    assert children.started[0].returncode == -signal.SIGKILL
