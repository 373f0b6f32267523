"""Run job bodies in child processes, while the parent claims jobs and writes outcomes.

This is Celery's prefork pool with the broker work kept in one place: the worker process
claims for every slot in one statement and writes every outcome through its batching
completer, and each child only runs one body at a time. A child is a fresh interpreter
started by ``argv`` (the caller's own command, which loads the same app and calls
``serve``); parent and child talk over two pipes, one JSON line per message, so nothing is
ever unpickled.

- A body that outlives its task's timeout ends with its process: the parent kills the
  child (SIGKILL, like Celery's hard time limit) and the run ends with ``JobTimeout``.
- A child that dies while running a body (OOM killer, segfault, ``os._exit``) ends that run
  with ``ProcessLost``, which spends the attempt like any exception; the job is retried.
- A dead or retired child is replaced; replacements that keep dying young wait longer.
- ``max_tasks_per_child``: a child is retired (told to exit) after that many bodies.
- Children start in their own session (a terminal's Ctrl-C reaches the parent only) and
  exit when the parent goes away: their pipe from the parent reaches end of file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .errors import AkadzeError, JobTimeout
from .executor import execute_here
from .outcomes import Outcome, raised

if TYPE_CHECKING:
    from .app import App

logger = logging.getLogger("akadze.worker")

#: Set in a child's environment: ``"<number>:<read fd>:<write fd>"``.
CHILD_ENV = "AKADZE_PROCESS_CHILD"
#: A child that lived shorter than this died young: its replacement waits a little.
YOUNG = 10.0
#: Longest wait before replacing a child that keeps dying young.
MAX_RESTART_DELAY = 10.0
# One message is one JSON line; a job's args and result may be large.
_LINE_LIMIT = 1 << 30
_DATETIME_FIELDS = ("scheduled_at", "expires_at", "created_at", "started_at")
# Tells a child to exit; end of file without it means the parent died.
_STOP = b'{"stop": true}\n'


class ProcessPoolError(AkadzeError):
    """The pool could not start its processes (the child's own error is on stderr)."""


class ProcessLost(Exception):
    """The process running the body died before it answered."""


# An outcome's fields, in order, as one tuple: dataclasses.astuple deep-copies every field
# (a tenth of a child's time per no-op body), and the fields are plain values anyway.
_outcome_values = operator.attrgetter(*(item.name for item in fields(Outcome)))


def _encode_row(row: Mapping[str, Any], worker_id: int | None) -> bytes:
    fields = dict(row)
    for name in _DATETIME_FIELDS:
        value = fields.get(name)
        if isinstance(value, datetime):
            fields[name] = value.isoformat()
    return json.dumps({"row": fields, "worker_id": worker_id}).encode() + b"\n"


def _decode_row(message: dict[str, Any]) -> dict[str, Any]:
    row = message["row"]
    for name in _DATETIME_FIELDS:
        value = row.get(name)
        if isinstance(value, str):
            row[name] = datetime.fromisoformat(value)
    return row


@dataclass
class _Child:
    number: int
    process: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.WriteTransport
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    busy: bool = False


class ProcessPool:
    """``processes`` children, each started with ``argv`` (plus ``env``), running bodies.

    The worker owns the pool: ``start`` before claiming, ``run`` per job, ``close`` after
    its runs have ended. ``argv`` must load the same app and call ``serve(app)``.
    """

    def __init__(self, processes: int, argv: Sequence[str], *,
                 env: Mapping[str, str] | None = None,
                 max_tasks_per_child: int | None = None,
                 start_timeout: float = 120.0) -> None:
        if processes < 1:
            raise ValueError("a process pool needs at least one process")
        if max_tasks_per_child is not None and max_tasks_per_child < 1:
            raise ValueError("max_tasks_per_child must be at least 1")
        self.processes = processes
        self.argv = list(argv)
        self.env = dict(env or {})
        self.max_tasks_per_child = max_tasks_per_child
        self.start_timeout = start_timeout
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._children: dict[int, _Child] = {}
        self._numbers = 0
        self._young_deaths = 0
        self._replacing: set[asyncio.Task[None]] = set()
        self._closing = False
        # Jobs handed to run() that wait for a free process (claimed ahead of the children).
        self._waiting: set[int] = set()

    def waiting(self, job_id: int) -> bool:
        """Whether the job is still waiting for a free process (its body has not started)."""
        return job_id in self._waiting

    @property
    def pids(self) -> list[int]:
        """The process ids of the live children."""
        return [child.process.pid for child in self._children.values()]

    async def start(self) -> None:
        """Start every child and wait until each is ready. The first starts alone, so a
        broken setup prints its error once, not once per process."""
        self._idle.put_nowait(await self._spawn())
        others = await asyncio.gather(*(self._spawn() for _ in range(self.processes - 1)),
                                      return_exceptions=True)
        for child in others:
            if isinstance(child, BaseException):
                raise child
            self._idle.put_nowait(child)
        logger.info("%d processes ready to run bodies: pids %s", self.processes,
                    ", ".join(map(str, self.pids)))

    async def run(self, row: Mapping[str, Any], worker_id: int | None,
                  timeout: float | None) -> Outcome | None:
        """Run the job of ``row`` in an idle child; returns its outcome (None: complete_tx
        wrote it). Raises ``JobTimeout`` or ``ProcessLost``; on cancellation the child is
        ended, since its body cannot be stopped any other way."""
        self._waiting.add(row["id"])
        try:
            child = await self._idle.get()
            while child.number not in self._children or child.process.poll() is not None:
                if child.number in self._children:  # died idle, before _exited heard of it
                    self._died_idle(child)
                child = await self._idle.get()
        finally:
            self._waiting.discard(row["id"])
        child.busy = True
        try:
            child.writer.write(_encode_row(row, worker_id))
            if timeout is None:
                line = await child.reader.readline()
            else:
                line = await asyncio.wait_for(child.reader.readline(), timeout)
        except asyncio.TimeoutError:
            self._replace(child, kill=True)
            raise JobTimeout(f"the task ran longer than its timeout of {timeout:g}s; its "
                             f"process (pid {child.process.pid}) was ended") from None
        except BaseException:
            self._replace(child, kill=True)
            raise
        if not line.endswith(b"\n"):
            code = await self._exit_code(child)
            logger.warning("worker process %s %s while running job %s: replacing it",
                           child.process.pid, _describe_exit(code), row["id"])
            self._replace(child, kill=True)
            raise ProcessLost(f"the process running the job (pid {child.process.pid}) "
                              f"{_describe_exit(code)} before it answered")
        child.done += 1
        child.busy = False
        if self.max_tasks_per_child and child.done >= self.max_tasks_per_child:
            logger.info("process %s ran %d tasks (max_tasks_per_child): replacing it",
                        child.process.pid, child.done)
            self._replace(child, kill=False)
        else:
            self._idle.put_nowait(child)
        values = json.loads(line)
        return None if values is None else Outcome(*values)

    async def execute(self, app: App, row: Mapping[str, Any],
                      worker_id: int | None) -> Outcome | None:
        """``run`` with the task's timeout, a timeout or a lost process as the run's
        outcome (both spend the attempt, like any exception)."""
        task = app.tasks.get(row["task"])
        try:
            return await self.run(row, worker_id, task.timeout if task else None)
        except (JobTimeout, ProcessLost) as exc:
            return raised(row["id"], row["run_count"], row["attempt"], exc,
                          task.backoff if task else None)

    async def close(self, timeout: float = 5.0) -> None:
        """Ask every child to exit (end of file on its pipe), kill those still there after
        ``timeout``, and stop replacing children."""
        self._closing = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        children = list(self._children.values())
        for child in children:
            child.writer.write(_STOP)
            child.writer.close()
        deadline = time.monotonic() + timeout
        while any(child.process.poll() is None for child in children):
            if time.monotonic() >= deadline:
                for child in children:
                    with contextlib.suppress(ProcessLookupError):
                        child.process.kill()
                break
            await asyncio.sleep(0.02)
        for child in children:
            await self._exit_code(child)
        self._children.clear()

    # --- children -----------------------------------------------------------------------------

    async def _spawn(self) -> _Child:
        self._numbers += 1
        number = self._numbers
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {**os.environ, **self.env, CHILD_ENV: f"{number}:{to_child_r}:{from_child_w}"}
        try:
            process = subprocess.Popen(self.argv, env=env, pass_fds=(to_child_r, from_child_w),
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(from_child_r, "rb", buffering=0))
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol,
                                                  os.fdopen(to_child_w, "wb", buffering=0))
        child = _Child(number, process, reader, writer)  # type: ignore[arg-type]
        self._children[number] = child
        self._watch(child)
        try:
            ready = await asyncio.wait_for(reader.readline(), self.start_timeout)
        except asyncio.TimeoutError:
            ready = b""
        if not ready.endswith(b"\n"):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await self._exit_code(child)
            del self._children[number]
            writer.close()
            raise ProcessPoolError(f"a worker process {_describe_exit(code)} before it was "
                                   f"ready (its error is above)")
        return child

    def _watch(self, child: _Child) -> None:
        """Hear at once of a child that exits while idle (killed from outside), so it is
        replaced before a job is handed to it; a busy child's exit reaches ``run``."""
        try:
            pidfd = os.pidfd_open(child.process.pid)
        except (AttributeError, OSError):  # no pidfd here: run() checks before each job
            return
        loop = asyncio.get_running_loop()

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not (child.busy or self._closing) and child.number in self._children:
                self._died_idle(child)

        loop.add_reader(pidfd, exited)

    def _died_idle(self, child: _Child) -> None:
        logger.warning("worker process %s %s while idle: replacing it", child.process.pid,
                       _describe_exit(child.process.poll()))
        self._replace(child, kill=True)

    def _replace(self, child: _Child, kill: bool) -> None:
        """Retire ``child`` (killed, or told to exit) and start its replacement."""
        self._children.pop(child.number, None)
        if not kill:
            child.writer.write(_STOP)
        child.writer.close()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
        young = time.monotonic() - child.started < YOUNG and kill
        self._young_deaths = self._young_deaths + 1 if young else 0
        if self._closing:
            return
        task = asyncio.create_task(self._replacement(child, self._young_deaths))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replacement(self, old: _Child, young_deaths: int) -> None:
        await self._exit_code(old)
        delay = min(MAX_RESTART_DELAY, 0.1 * 2 ** young_deaths) if young_deaths > 1 else 0.0
        while not self._closing:
            if delay:
                await asyncio.sleep(delay)
            try:
                self._idle.put_nowait(await self._spawn())
                return
            except ProcessPoolError as exc:
                delay = min(MAX_RESTART_DELAY, max(0.5, delay * 2))
                logger.error("%s; trying again in %.1fs", exc, delay)

    async def _exit_code(self, child: _Child) -> int:
        """Wait (without blocking the loop) for ``child`` to exit; its exit code."""
        while (code := child.process.poll()) is None:
            await asyncio.sleep(0.01)
        return code


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was ended by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def is_child() -> bool:
    """Whether this process is a pool child (its command should call ``serve``)."""
    return CHILD_ENV in os.environ


def child_number() -> int:
    """This child's number in its pool (1, 2, ...; replacements get new numbers)."""
    return int(os.environ[CHILD_ENV].split(":")[0])


def serve(app: App) -> int:
    """A pool child's life: tell the parent it is ready, then run one body per message
    until the parent says stop (or dies). Returns the exit code (0)."""
    number, read_fd, write_fd = (int(part) for part in os.environ.pop(CHILD_ENV).split(":"))
    del number
    parent = os.getppid()
    # The parent decides when children stop: Ctrl-C in a terminal is for the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb") as writer:
        writer.write(json.dumps({"ready": os.getpid()}).encode() + b"\n")
        writer.flush()
        for line in reader:
            message = json.loads(line)
            if message.get("stop"):
                break
            outcome = execute_here(app, _decode_row(message), message["worker_id"])
            answer = None if outcome is None else _outcome_values(outcome)
            writer.write(json.dumps(answer).encode() + b"\n")
            writer.flush()
        else:
            # End of file without a stop message: the worker process died (SIGKILL?).
            logger.warning("the worker process (pid %s) is gone: exiting", parent)
    sys.stdout.flush()
    return 0
