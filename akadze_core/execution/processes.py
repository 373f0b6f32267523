"""Run job bodies in child processes, while the parent claims jobs and writes outcomes.

This is Celery's prefork pool with the broker work kept in one place: the worker process
claims for every slot in one statement and writes every outcome through its batching
completer, and each child only runs one body at a time. A child is a fresh interpreter
started by ``argv`` (the caller's own command, which loads the same app and calls
``serve``); parent and child talk over two pipes, one JSON line per message, so nothing is
ever unpickled (``akadze_core.execution.process_child``).

- A body that outlives its task's timeout ends with its process: the parent kills the
  child (SIGKILL, like Celery's hard time limit) and the run ends with ``JobTimeout``.
- A soft limit (``limits``: none for the core's own tasks, Celery's ``soft_time_limit``
  for akadze_compat's) is a signal to the child (``soft_signal``, SIGUSR1 as in Celery's
  billiard): the child's handler raises in the body's thread, which interrupts a blocking
  call such as ``time.sleep`` or a socket read. A pool given soft limits must run children
  that handle that signal (its default action ends the process).
- ``terminate(job_id, signal)`` (a cancel request with ``terminate``): the child running
  that job gets the signal. If it dies of it the run ends with ``Terminated`` (the job is
  cancelled, its attempt unspent) and the child is replaced; if it survives (a handler),
  the body goes on and its outcome decides. A job sent behind a running one gets the
  signal as it starts; one waiting for a process is dropped and never starts.
- A child that dies while running a body (OOM killer, segfault, ``os._exit``) ends that run
  with ``ProcessLost``, which spends the attempt like any exception; the job is retried.
- A dead or retired child is replaced; replacements that keep dying young wait longer.
- ``max_tasks_per_child``: a child is retired (told to exit) after that many bodies.
- A job waits for a free process, never behind a busy one (Celery's ``-O fair``), with one
  exception that skips a process wake-up per job: jobs of a task whose last runs all took
  under ``SHORT`` may be sent behind a running job of such a task, at most ``DEPTH - 1``
  of them per process. A job sent behind another starts (and its timeout starts) when the
  one before it ends; if that one ends its process, the jobs behind it never started and
  go to another process, their attempt unspent.
- Claiming ahead: while the pool's last runs were all short, the worker may hold ``ahead``
  jobs beyond its slots, as many as its processes run in about ``AHEAD_BUDGET`` of body
  time at their recent pace (at most ``AHEAD`` per process). They wait here, never behind a
  busy process; what they buy is bigger claims and outcome flushes, which is most of the
  cost of a job this short. A body running for ``SHORT`` pauses it, and ending that long
  stops it until short runs are seen again.
- Cancel and expiry of a job claimed ahead: while it waits for a process, the worker may
  ``drop`` it (it heard of a cancel request, or the job's expiry came): it ends
  ``NotStarted`` and never reaches a child. A job sent into a busy child's pipe behind a
  running one is past that point: it counts as started, like a running job (it is a short
  task's, and it starts within ``DEPTH - 1`` short bodies).
- Children start in their own session (a terminal's Ctrl-C reaches the parent only) and
  exit when the parent goes away: their pipe from the parent reaches end of file.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..model.errors import JobTimeout
from ..model.outcomes import CANCEL, UNSTARTED, Outcome, error_entry, raised
from .children import (
    Child,
    Done,
    NotStarted,
    ProcessLost,
    ProcessPoolError,
    Run,
    Terminated,
    describe_exit,
    signal_name,
)

# The child's side, re-exported: the commands that start children import them from here.
from .process_child import (
    CHILD_ENV,
    STOP,
    child_number,
    decode_answer,
    encode_rows,
    is_child,
    serve,
)

__all__ = ["AHEAD", "AHEAD_BUDGET", "CHILD_ENV", "DEPTH", "SHORT", "ProcessPool", "child_number",
           "is_child", "serve"]

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.worker")

#: A child that lived shorter than this died young: its replacement waits a little.
YOUNG = 10.0
#: Longest wait before replacing a child that keeps dying young.
MAX_RESTART_DELAY = 10.0
# One message is one JSON line; a job's args and result may be large.
_LINE_LIMIT = 1 << 30
#: A task is short when its last SHORT_RUNS bodies each took less than SHORT seconds (as
#: the child measured them, its own log lines included). Waking a sleeping process costs a
#: few hundred microseconds on a busy machine: for the shortest tasks that is most of each
#: job. A job sent behind such runs waits for at most DEPTH - 1 of them (~0.1 s), unless a
#: short task suddenly takes long.
SHORT = 0.01
SHORT_RUNS = 3
#: Jobs of short tasks a process may have been sent at once: one running, the rest waiting
#: in its pipe. The jobs sent to a process in one loop turn go in one write, and each write
#: wakes it (and lets it take the CPU from the parent on a busy host): at -c 2 on 2 cores,
#: no-ops drained faster at 10 than at 3 or 6 (16: no better). They are shared one job
#: at a time between the processes with the fewest, so no process idles while another holds
#: the backlog.
DEPTH = 10
#: Body time, per process, that jobs claimed ahead may add up to (see ``ProcessPool.ahead``).
#: A worker claims when a slot frees: with Celery's window alone (10 at -c 2) a pool of
#: no-op jobs claimed 4.6 per statement and wrote 6 outcomes per flush; 16 more per
#: process made both 15, and the database's CPU per job half; 32 made both about 28, and
#: the drain faster again (64: no better).
AHEAD_BUDGET = 0.02
#: The most jobs claimed ahead per process, however short the runs.
AHEAD = 32
# Weight of the latest run in the pool's pace (a moving average of short bodies' time).
_PACE_WEIGHT = 0.1


class ProcessPool:
    """``processes`` children, each started with ``argv`` (plus ``env``), running bodies.

    The worker owns the pool: ``start`` before claiming, ``run`` per job, ``close`` after
    its runs have ended. ``argv`` must load the same app and call ``serve(app)``.
    Subclasses decide a job's limits (``limits``) and the outcome of a run that ended with
    its process (``lost_outcome``).
    """

    #: Sent to a child when its body reaches its soft limit.
    soft_signal: int = signal.SIGUSR1

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
        #: The database's key of derived task ids, handed to the children with each job
        #: (the worker sets it once connected; ``akadze_core.model.task_ids``).
        self.task_id_key: str | None = None
        self._idle: list[Child] = []
        self._children: dict[int, Child] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self._numbers = 0
        self._young_deaths = 0
        self._replacing: set[asyncio.Task[None]] = set()
        self._closing = False
        # Jobs handed to run() that wait for a process (claimed ahead of the children).
        self._pending: collections.deque[Run] = collections.deque()
        # Children with messages in their outbox, written once this turn of the loop ends.
        self._unflushed: list[Child] = []
        self._waiting: set[int] = set()
        # Per task name: how many of its last runs in a row were short (see SHORT).
        self._short_streak: dict[str, int] = {}
        # Across tasks: how many runs in a row were short, and their average body time.
        self._short_in_row = 0
        self._pace = SHORT

    @property
    def ahead(self) -> int:
        """How many jobs the worker may hold now beyond its slots: as many as the processes
        run in ``AHEAD_BUDGET`` of body time each at their recent pace (``AHEAD`` at most),
        while the pool's last ``SHORT_RUNS`` runs per process were all short and no body
        running now has run for ``SHORT``; else none."""
        if self._short_in_row < SHORT_RUNS * self.processes:
            return 0
        now = time.monotonic()
        if any(child.sent and now - child.run_since >= SHORT
               for child in self._children.values()):
            return 0  # a long run may have begun: what is held ahead would wait for it
        return min(AHEAD, int(AHEAD_BUDGET / self._pace)) * self.processes

    def waiting(self, job_id: int) -> bool:
        """Whether the job is still waiting for a process (it was sent to none yet)."""
        return job_id in self._waiting

    def drop(self, job_id: int) -> bool:
        """Take the job out of line if it still waits for a process: its ``run`` raises
        ``NotStarted``. False when it was sent to a process already (or is unknown)."""
        run = self._take_waiting(job_id)
        if run is None:
            return False
        self._end(run, None, NotStarted())
        return True

    def _take_waiting(self, job_id: int) -> Run | None:
        """Take the run of ``job_id`` out of line if it still waits for a process."""
        if job_id not in self._waiting:
            return None
        for run in self._pending:
            if run.row["id"] == job_id:
                self._pending.remove(run)
                self._waiting.discard(job_id)
                return run
        return None

    def _find_sent(self, job_id: int) -> tuple[Child, int, Run] | None:
        """The child that the run of ``job_id`` was sent to, its place in that child's line
        (0: running) and the run; None when no child holds it."""
        for child in list(self._children.values()):
            for position, run in enumerate(child.sent):
                if run.row["id"] == job_id:
                    return child, position, run
        return None

    @property
    def pids(self) -> list[int]:
        """The process ids of the live children."""
        return [child.process.pid for child in self._children.values()]

    async def start(self) -> None:
        """Start every child and wait until each is ready. The first starts alone, so a
        broken setup prints its error once, not once per process."""
        self._ready(await self._spawn())
        others = await asyncio.gather(*(self._spawn() for _ in range(self.processes - 1)),
                                      return_exceptions=True)
        for child in others:
            if isinstance(child, BaseException):
                raise child
            self._ready(child)
        logger.info("%d processes ready to run bodies: pids %s", self.processes,
                    ", ".join(map(str, self.pids)))

    def terminate(self, job_id: int, signum: int) -> bool:
        """Send ``signum`` to the child running ``job_id`` (a terminate request); a job sent
        behind a running one gets it as it starts, one waiting for a process is dropped
        (its ``run`` raises ``NotStarted``). False when the pool does not hold the job."""
        if self.drop(job_id):
            return True
        found = self._find_sent(job_id)
        if found is None:
            return False
        child, position, run = found
        run.terminate = signum
        if position == 0:
            self._signal(child, signum)
        return True

    def _signal(self, child: Child, signum: int) -> None:
        """Send a terminate request's signal to ``child``, which runs its first sent job."""
        logger.info("job %s: terminate requested, sending %s to process %s",
                    child.sent[0].row["id"], signal_name(signum), child.process.pid)
        child.terminated = signum
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.process.pid, signum)

    def limits(self, app: App, row: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """(soft, hard) limits in seconds for the job of ``row`` (None: no limit): no soft
        limit, the task's timeout as the hard one."""
        task = app.tasks.get(row["task"])
        return None, (task.timeout if task else None)

    def lost_outcome(self, app: App, row: Mapping[str, Any], exc: Exception) -> Outcome:
        """The outcome of a run that ended with its process: ``Terminated`` cancels the job
        (the attempt is given back, as a cancel was requested); a timeout or a lost process
        spends the attempt, like any exception."""
        if isinstance(exc, Terminated):
            return Outcome(row["id"], row["run_count"], CANCEL,
                           error=error_entry(exc, redact=app.redact),
                           claim_token=row.get("claim_token"))
        task = app.tasks.get(row["task"])
        return raised(row["id"], row["run_count"], row["attempt"], exc,
                      task.backoff if task else None, app.redact,
                      claim_token=row.get("claim_token"))

    async def run(self, row: Mapping[str, Any], worker_id: int | None,
                  timeout: float | None, soft: float | None = None) -> Outcome | None:
        """Run the job of ``row`` in a child; returns its outcome (None: complete_tx wrote
        it). ``soft``: the child gets ``soft_signal`` after that many seconds. Raises
        ``JobTimeout``, ``ProcessLost`` or ``Terminated``; on cancellation the child running
        it is ended, since its body cannot be stopped any other way."""
        future: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
        run = Run(row, worker_id, timeout, future, soft)
        self._pending.append(run)
        self._waiting.add(row["id"])
        self._dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if row["id"] in self._waiting:
                self._pending.remove(run)
                self._waiting.discard(row["id"])
            else:
                # Running: only ending its process stops the body. Sent behind another job:
                # it stays in line (the process will answer for it), its answer unheard.
                for child in list(self._children.values()):
                    if child.sent and child.sent[0] is run:
                        child.sent.popleft()
                        self._lost(child)
            raise

    def submit(self, app: App, row: Mapping[str, Any], worker_id: int | None,
               done: Done) -> None:
        """A run without a coroutine: ``done(row, outcome, None)`` is called on the loop
        once the run ended, with the outcome a run in the worker's loop would make, or
        ``done(row, None, error)`` if making that outcome raised ``error`` (a bug). It may
        be called from any of the pool's methods that end runs (``drop``, ``terminate``),
        never from ``submit`` itself. ``cancel`` takes the run back without a call."""
        soft, hard = self.limits(app, row)
        self._pending.append(Run(row, worker_id, hard, None, soft, None, done, app))
        self._waiting.add(row["id"])
        self._dispatch()

    def cancel(self, job_id: int) -> bool:
        """Take back a run handed to ``submit`` as cancelling ``run`` would (the worker is
        stopping): one still waiting leaves the line, a running one ends with its process
        (nothing else stops its body), one sent behind another stays in that process's
        pipe, unheard. Its ``done`` is not called. False when the pool does not hold it."""
        waiting = self._take_waiting(job_id)
        if waiting is not None:
            waiting.ended = True
            return True
        if job_id in self._waiting:
            return False
        found = self._find_sent(job_id)
        if found is None:
            return False
        child, position, run = found
        run.ended = True
        if position == 0:
            child.sent.popleft()
            self._lost(child)
        return True

    def _end(self, run: Run, outcome: Outcome | None, error: Exception | None) -> None:
        """Tell the end of ``run``: its ``outcome``, or the ``error`` (``NotStarted``, or
        how its process ended) that ended it without one."""
        if run.ended:
            return
        run.ended = True
        future = run.future
        if future is not None:
            if not future.done():
                if error is None:
                    future.set_result(outcome)
                else:
                    future.set_exception(error)
            return
        internal: Exception | None = None
        if error is not None:
            try:
                outcome = self._outcome_of(run.app, run.row, error)
            except Exception as exc:
                internal = exc
        assert run.done is not None
        try:
            run.done(run.row, outcome, internal)
        except Exception:  # the pool's reader must go on whatever its caller does
            logger.exception("job %s: the end of its run could not be handled", run.row["id"])

    def _outcome_of(self, app: App, row: Mapping[str, Any], error: Exception) -> Outcome:
        """The outcome of a run that ended without an answer (as a run in the worker's
        loop maps it)."""
        if isinstance(error, NotStarted):
            return Outcome(row["id"], row["run_count"], UNSTARTED,
                           claim_token=row.get("claim_token"))
        if isinstance(error, (JobTimeout, ProcessLost, Terminated)):
            return self.lost_outcome(app, row, error)
        raise error

    async def execute(self, app: App, row: Mapping[str, Any],
                      worker_id: int | None) -> Outcome | None:
        """``run`` with the job's ``limits``; a run that ended with its process (timeout,
        lost, terminated) ends as ``lost_outcome`` says; a job dropped before it started
        ends ``unstarted`` (the database decides cancelled or queued)."""
        soft, hard = self.limits(app, row)
        try:
            return await self.run(row, worker_id, hard, soft)
        except NotStarted:
            return Outcome(row["id"], row["run_count"], UNSTARTED,
                           claim_token=row.get("claim_token"))
        except (JobTimeout, ProcessLost, Terminated) as exc:
            return self.lost_outcome(app, row, exc)

    async def close(self, timeout: float = 5.0) -> None:
        """Ask every child to exit (end of file on its pipe), kill those still there after
        ``timeout``, and stop replacing children."""
        self._closing = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        for run in self._pending:
            run.ended = True
            if run.future is not None:
                run.future.cancel()
        self._pending.clear()
        self._waiting.clear()
        children = list(self._children.values())
        for child in children:
            self._flush_child(child)
            child.writer.write(STOP)
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
        await asyncio.gather(*self._readers, return_exceptions=True)

    # --- dispatching ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Send waiting jobs: to idle children first, then behind busy ones (short tasks)."""
        pending = self._pending
        while pending and self._idle:
            child = self._idle.pop()
            if child.number not in self._children or child.process.poll() is not None:
                if child.number in self._children:  # died idle, its end of file not read yet
                    self._died_idle(child)
                continue
            self._send(child, pending.popleft())
        if not pending or not self._is_short(pending[0]):
            return
        behind = [child for child in self._children.values()
                  if 0 < len(child.sent) < DEPTH and not child.retiring
                  and all(map(self._is_short, child.sent))]
        # One job at a time to the child with the fewest, so that the processes share what
        # waits (filled one after the other, one got the backlog while another idled).
        while pending and behind and self._is_short(pending[0]):
            child = min(behind, key=lambda child: len(child.sent))
            if len(child.sent) >= DEPTH or (
                    self.max_tasks_per_child
                    and child.done + len(child.sent) >= self.max_tasks_per_child):
                behind.remove(child)
                continue
            run = pending[0]
            logger.debug("job %s sent to process %s behind job %s", run.row["id"],
                         child.process.pid, child.sent[-1].row["id"])
            self._send(child, pending.popleft())

    def _send(self, child: Child, run: Run) -> None:
        self._waiting.discard(run.row["id"])
        child.sent.append(run)
        if len(child.sent) == 1:
            self._started(child)
        # Written at the end of this turn of the event loop, with the other jobs sent to
        # this child meanwhile: one system call, and one wake-up of the child, for all of
        # them (a woken child preempts its writer on a busy host).
        if not child.outbox:
            if not self._unflushed:
                asyncio.get_running_loop().call_soon(self._flush)
            self._unflushed.append(child)
        child.outbox.append(run)

    def _flush(self) -> None:
        """Write every child's outbox (the jobs sent to it in the last loop turn)."""
        unflushed, self._unflushed = self._unflushed, []
        for child in unflushed:
            self._flush_child(child)

    def _flush_child(self, child: Child) -> None:
        """Write the jobs in ``child``'s outbox as one message (one per worker id)."""
        runs = child.outbox
        if not runs:
            return
        child.outbox = []
        worker_id = runs[0].worker_id
        if all(run.worker_id == worker_id for run in runs):
            data = encode_rows([run.row for run in runs], worker_id, self.task_id_key)
        else:  # runs handed to run() by different callers: a message per worker id in a row
            data = b"".join(
                encode_rows([run.row for run in group], group_id, self.task_id_key)
                for group_id, group in itertools.groupby(runs, lambda run: run.worker_id))
        if not child.writer.is_closing():
            child.writer.write(data)

    def _started(self, child: Child) -> None:
        """The first job sent to ``child`` starts now: its limits start too."""
        child.run_since = time.monotonic()
        child.terminated = None
        run = child.sent[0]
        loop = asyncio.get_running_loop()
        if run.timeout is not None:
            child.timer = loop.call_later(run.timeout, self._time_out, child, run.timeout)
        if run.soft is not None and (run.timeout is None or run.soft < run.timeout):
            child.soft_timer = loop.call_later(run.soft, self._soft_time_out, child, run)
        if run.terminate is not None:  # asked while it waited behind another job
            self._signal(child, run.terminate)

    def _stop_timers(self, child: Child) -> None:
        for timer in (child.timer, child.soft_timer):
            if timer is not None:
                timer.cancel()
        child.timer = child.soft_timer = None

    def _time_out(self, child: Child, timeout: float) -> None:
        child.timer = None
        child.timed_out = timeout
        with contextlib.suppress(ProcessLookupError):
            child.process.kill()  # its end of file reaches _read, which ends the run

    def _soft_time_out(self, child: Child, run: Run) -> None:
        child.soft_timer = None
        if child.sent and child.sent[0] is run:
            self.soft_limit_reached(run.row, run.soft)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, self.soft_signal)

    def soft_limit_reached(self, row: Mapping[str, Any], soft: float | None) -> None:
        """Called as the child running ``row`` is sent ``soft_signal`` (a log line)."""
        logger.info("job %s reached its soft limit of %gs: sending %s to its process",
                    row["id"], soft or 0.0, signal_name(self.soft_signal))

    def _is_short(self, run: Run) -> bool:
        return self._short_streak.get(run.row["task"], 0) >= SHORT_RUNS

    def _ready(self, child: Child) -> None:
        """``child`` is ready to run bodies: read its answers, and give it work."""
        child.ready = True
        task = asyncio.create_task(self._read(child), name=f"process-{child.number}")
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)
        self._idle.append(child)
        self._dispatch()

    async def _read(self, child: Child) -> None:
        """Answers of ``child``, one line per job sent, in order, until its end of file."""
        while True:
            line = await child.reader.readline()
            if not line.endswith(b"\n"):
                await self._ended(child)
                return
            if not child.sent:
                continue  # the answer of a run cancelled while this process is ended
            self._stop_timers(child)
            # Signalled, it answered: it survived the signal, or beat it (see stray_signal).
            child.stray_signal, child.terminated = child.terminated, None
            run = child.sent.popleft()
            took, outcome = decode_answer(line)
            task = run.row["task"]
            if took < SHORT:
                self._short_streak[task] = self._short_streak.get(task, 0) + 1
                self._short_in_row += 1
                self._pace += (took - self._pace) * _PACE_WEIGHT
            else:
                self._short_streak[task] = self._short_in_row = 0
            child.done += 1
            self._end(run, outcome, None)
            if child.timed_out is not None:
                # It answered just as its timeout ended its process: the jobs behind it
                # (if one started, it was at its very first instant) go elsewhere.
                self._lost(child)
                return
            if child.sent:
                self._started(child)
            elif self.max_tasks_per_child and child.done >= self.max_tasks_per_child:
                logger.info("process %s ran %d tasks (max_tasks_per_child): replacing it",
                            child.process.pid, child.done)
                self._replace(child, kill=False)
            elif child.number in self._children:
                self._idle.append(child)
            self._dispatch()

    async def _ended(self, child: Child) -> None:
        """``child``'s pipe reached end of file: it exited (killed, crashed, timed out,
        retired). The job it was running ends; those waiting behind it go elsewhere."""
        child.retiring = True  # nothing more is sent to it while its exit code is read
        self._stop_timers(child)
        code = await self._exit_code(child)
        if not child.sent:
            if child.number in self._children and not self._closing:
                self._died_idle(child)
            return
        self._short_in_row = 0  # a run that ends its process is no short one
        if (child.terminated is None and child.timed_out is None
                and child.stray_signal is not None and code == -child.stray_signal):
            # Killed by the signal meant for the job before: the running one goes back in
            # line with those behind it, unspent (it had started an instant before).
            logger.info("worker process %s %s, the signal meant for the job before job %s: "
                        "replacing it; the job runs again", child.process.pid,
                        describe_exit(code), child.sent[0].row["id"])
            self._lost(child)
            return
        running = child.sent.popleft()
        if child.terminated is not None and child.timed_out is None:
            logger.info("worker process %s %s after a terminate request for job %s: "
                        "replacing it", child.process.pid, describe_exit(code),
                        running.row["id"])
            error: Exception = Terminated(
                child.terminated, f"terminated by request: the process running the job "
                f"(pid {child.process.pid}) {describe_exit(code)}")
        elif child.timed_out is not None:
            error = JobTimeout(
                f"the task ran longer than its timeout of {child.timed_out:g}s; its "
                f"process (pid {child.process.pid}) was ended")
        else:
            logger.warning("worker process %s %s while running job %s: replacing it",
                           child.process.pid, describe_exit(code), running.row["id"])
            error = ProcessLost(f"the process running the job (pid {child.process.pid}) "
                                f"{describe_exit(code)} before it answered")
        self._lost(child)
        self._end(running, None, error)

    def _lost(self, child: Child) -> None:
        """End and replace ``child``; the jobs sent behind its running one never started:
        they wait for a process again, first in line."""
        behind = list(child.sent)
        child.sent.clear()
        child.outbox.clear()  # sent but not written yet: they wait for a process again
        for run in reversed(behind):
            if run.terminate is not None:  # asked to terminate before it started: dropped
                self._end(run, None, NotStarted())
                continue
            if run.ended:  # cancelled (the worker stops): it must not run after all
                continue
            self._pending.appendleft(run)
            self._waiting.add(run.row["id"])
        if child.number in self._children:
            self._replace(child, kill=True)
        self._dispatch()

    # --- children -----------------------------------------------------------------------------

    async def _spawn(self) -> Child:
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
        child = Child(number, process, reader, writer)  # type: ignore[arg-type]
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
            self._children.pop(number, None)
            writer.close()
            raise ProcessPoolError(f"a worker process {describe_exit(code)} before it was "
                                   f"ready (its error is above)")
        return child

    def _watch(self, child: Child) -> None:
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
            if (child.ready and not (child.busy or self._closing)
                    and child.number in self._children):
                self._died_idle(child)

        loop.add_reader(pidfd, exited)

    def _died_idle(self, child: Child) -> None:
        logger.warning("worker process %s %s while idle: replacing it", child.process.pid,
                       describe_exit(child.process.poll()))
        self._replace(child, kill=True)

    def _replace(self, child: Child, kill: bool) -> None:
        """Retire ``child`` (killed, or told to exit) and start its replacement."""
        self._children.pop(child.number, None)
        child.retiring = True
        if child in self._idle:
            self._idle.remove(child)
        if not kill:
            self._flush_child(child)
            child.writer.write(STOP)
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

    async def _replacement(self, old: Child, young_deaths: int) -> None:
        await self._exit_code(old)
        delay = min(MAX_RESTART_DELAY, 0.1 * 2 ** young_deaths) if young_deaths > 1 else 0.0
        while not self._closing:
            if delay:
                await asyncio.sleep(delay)
            try:
                self._ready(await self._spawn())
                return
            except ProcessPoolError as exc:
                delay = min(MAX_RESTART_DELAY, max(0.5, delay * 2))
                logger.error("%s; trying again in %.1fs", exc, delay)

    async def _exit_code(self, child: Child) -> int:
        """Wait (without blocking the loop) for ``child`` to exit; its exit code."""
        while (code := child.process.poll()) is None:
            await asyncio.sleep(0.01)
        return code
