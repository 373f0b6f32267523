"""``-P prefork``: a small supervisor of worker processes, each running one akadze_core Worker.

CPU-bound Celery tasks need processes, so ``akadze-compat worker -P prefork -c N`` starts N
children (fresh interpreters, re-executing the same command) and only supervises them:

- A child reports it is ready (registered, claiming) by writing its pid to a pipe. The
  first child is started alone and the others once it is ready, so a broken setup (schema
  missing, wrong password) prints its one error line once, not N times.
- The first SIGTERM/SIGINT is forwarded as SIGTERM (each child stops claiming and drains),
  the second is forwarded too (each child stops at once, handing its jobs back), a third
  kills them. SIGQUIT is forwarded as it is (a child stops at once).
- A child that dies unexpectedly (killed, crashed) is replaced, at once the first time and
  with a growing delay (up to ``MAX_RESTART_DELAY``) while replacements keep dying young.
  A child that exits 0 (it ran ``--max-tasks-per-child`` tasks) is replaced at once.
- A child that exits 1 lost the database for longer than its heartbeat TTL or hit an error
  retrying cannot fix: the supervisor stops the others and exits 1.

Children run in their own session, so a terminal's Ctrl-C reaches the supervisor only, and
each child watches its parent (``watch_parent``) to stop when the supervisor is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CHILD_ENV", "ChildInfo", "Supervisor", "child_info", "report_ready", "watch_parent"]

logger = logging.getLogger("akadze_compat.worker_pool")

#: Set in a child's environment: ``"<process number>:<ready fd>:<supervisor pid>"``.
CHILD_ENV = "AKADZE_COMPAT_POOL_CHILD"
#: Longest wait before replacing a child that keeps dying soon after it started.
MAX_RESTART_DELAY = 10.0
#: A child that lived shorter than this died "young": its replacement waits.
YOUNG = 10.0

Spawn = Callable[[int, int], "subprocess.Popen[bytes]"]


@dataclass
class _Child:
    slot: int
    number: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    ready: bool = False


class Supervisor:
    """Keeps ``processes`` children running until stopped; ``run()`` returns the exit code.

    ``spawn(number, ready_fd)`` starts child number ``number`` (1, 2, ... in start order),
    handing it ``ready_fd`` to report readiness with ``report_ready``. ``on_ready()`` is
    called once, when every slot first has a ready child; ``on_stopping(sig, how)`` on each
    stop signal (``how`` is "Warm" or "Cold").
    """

    def __init__(self, processes: int, spawn: Spawn, *,
                 on_ready: Callable[[], None] = lambda: None,
                 on_stopping: Callable[[str, str], None] = lambda sig, how: None,
                 tick: float = 0.2) -> None:
        if processes < 1:
            raise ValueError("a pool needs at least one process")
        self.processes = processes
        self.spawn = spawn
        self.on_ready = on_ready
        self.on_stopping = on_stopping
        self.tick = tick
        self.children: dict[int, _Child] = {}
        self.signals_received = 0
        self.cold = False
        self._pending: list[int] = []
        self._numbers = 0
        self._announced = False
        self._failed = False
        self._restart_at: dict[int, float] = {}
        self._delays: dict[int, float] = {}

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until every child has stopped; 0, or 1 when a child exited 1."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        previous = {signum: signal.signal(signum, self._on_signal)
                    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)}
        try:
            self._start(0, write_fd)
            while self.children or not self.stopping:
                self._handle_signals()
                self._read_ready(read_fd)
                self._reap()
                if not self.stopping:
                    self._restart_due(write_fd)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._kill_all()
            os.close(read_fd)
            os.close(write_fd)
        return 1 if self._failed or self.cold else 0

    @property
    def stopping(self) -> bool:
        """Whether a stop was asked for (a signal, or a child that exited 1)."""
        return self.signals_received > 0 or self._failed

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only note it: the loop acts on it within one tick (handlers must stay trivial).
        self._pending.append(signum)

    def _handle_signals(self) -> None:
        while self._pending:
            signum = self._pending.pop(0)
            self.signals_received += 1
            name = signal.Signals(signum).name
            if self.signals_received >= 3:
                logger.warning("third stop signal: killing the worker processes")
                self._send_all(signal.SIGKILL)
                continue
            cold = signum == signal.SIGQUIT or self.signals_received == 2
            self.cold = self.cold or cold
            self.on_stopping(name, "Cold" if cold else "Warm")
            self._send_all(signal.SIGQUIT if signum == signal.SIGQUIT else signal.SIGTERM)

    def _read_ready(self, read_fd: int) -> None:
        readable, _, _ = select.select([read_fd], [], [], self.tick)
        if not readable:
            return
        with contextlib.suppress(BlockingIOError):
            for word in os.read(read_fd, 4096).split():
                for child in self.children.values():
                    if str(child.process.pid) == word.decode(errors="replace"):
                        child.ready = True
                        self._delays.pop(child.slot, None)
        if not self.stopping and not self._announced and len(self.children) == \
                self.processes and all(child.ready for child in self.children.values()):
            self._announced = True
            self.on_ready()

    def _reap(self) -> None:
        for slot, child in list(self.children.items()):
            code = child.process.poll()
            if code is None:
                continue
            del self.children[slot]
            lived = time.monotonic() - child.started
            if self.stopping:
                self._failed = self._failed or code == 1
                continue
            if code == 1:
                # The child said why in its own error line; a startup failure needs no more.
                logger.log(logging.WARNING if child.ready else logging.INFO,
                           "worker process %s (pid %s) exited with 1: stopping the others",
                           child.number, child.process.pid)
                self._failed = True
                self._send_all(signal.SIGTERM)
                continue
            if code == 0:
                logger.info("worker process %s (pid %s) exited: replacing it", child.number,
                            child.process.pid)
                delay = 0.0
            else:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
                delay = self._delays.get(slot, 0.0) if lived < YOUNG else 0.0
                self._delays[slot] = min(MAX_RESTART_DELAY, max(0.5, delay * 2))
                logger.warning("worker process %s (pid %s) died unexpectedly (%s): replacing "
                               "it%s", child.number, child.process.pid, how,
                               f" in {delay:.1f}s" if delay else "")
            self._restart_at[slot] = time.monotonic() + delay

    def _restart_due(self, write_fd: int) -> None:
        now = time.monotonic()
        for slot, when in sorted(self._restart_at.items()):
            if when <= now:
                del self._restart_at[slot]
                self._start(slot, write_fd)
        # The others start once the first one is ready (see the module docstring).
        first = self.children.get(0)
        if first is not None and first.ready:
            for slot in range(1, self.processes):
                if slot not in self.children and slot not in self._restart_at:
                    self._start(slot, write_fd)

    # --- children ------------------------------------------------------------------------

    def _start(self, slot: int, write_fd: int) -> None:
        self._numbers += 1
        process = self.spawn(self._numbers, write_fd)
        self.children[slot] = _Child(slot, self._numbers, process)

    def _send_all(self, signum: int) -> None:
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signum)

    def _kill_all(self) -> None:
        """Leave no child behind (only reached with live children after a bug)."""
        for child in self.children.values():
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                child.process.wait()


# --- the child's side ----------------------------------------------------------------------

@dataclass(frozen=True)
class ChildInfo:
    """What a child learns from ``CHILD_ENV``."""

    number: int
    ready_fd: int
    parent_pid: int


def child_info() -> ChildInfo | None:
    """This process's place in a pool, or None when it is not a pool child."""
    value = os.environ.get(CHILD_ENV)
    if not value:
        return None
    number, ready_fd, parent_pid = (int(part) for part in value.split(":"))
    return ChildInfo(number, ready_fd, parent_pid)


def report_ready(info: ChildInfo) -> None:
    """Tell the supervisor this child is claiming jobs."""
    with contextlib.suppress(OSError):
        os.write(info.ready_fd, f"{os.getpid()}\n".encode())


def watch_parent(info: ChildInfo, stop: Callable[[], None], interval: float = 1.0) -> None:
    """Call ``stop()`` (once) when the supervisor is gone, from a daemon thread."""

    def watch() -> None:
        while os.getppid() == info.parent_pid:
            time.sleep(interval)
        logger.warning("the supervisor (pid %s) is gone: stopping", info.parent_pid)
        stop()

    threading.Thread(target=watch, name="akadze-parent-watch", daemon=True).start()
