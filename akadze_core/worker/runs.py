"""The runs in flight: the window of jobs a worker holds, from the claim to the outcome
handed to the completer, and the cancel and expiry of those claimed ahead.

A run claimed ahead waits (for a body slot of ``concurrency``, or a free process of the
process pool) without having started: no body, no attempt spent. Seed 003: a job cancelled
or expired before it starts ends cancelled without running. The claim checks that for the
runs that start at once; a run claimed ahead is dropped when the worker hears of its cancel
(the akadze_cancel NOTIFY, checked again every heartbeat) or its expiry (a timer), and its
'unstarted' outcome goes through the completer: the database judges cancelled (its own
clock for the expiry) or queued again. No statement per job: runs that never wait, and
waits nobody cancels, cost nothing.

A worker with neither a process pool nor a concurrency limit claims ahead too, while its
runs are short (``ahead``): each queue's runs then go through a body gate of that queue's
slots, so no more than its slots run at once, and the next claim is under way while the
runs of the last one go on.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg

from ..execution.context import CURRENT, set_current
from ..execution.eager import MakeTask, eager_tasks
from ..execution.executor import call_body, prepare, raised_outcome, returned_outcome
from ..execution.gate import BodyGate
from ..execution.processes import SHORT
from ..model.outcomes import RETRY, UNSTARTED, Outcome, error_entry, raised
from ..model.retry import default_backoff
from ..store import database
from .maintenance import Guard
from .run_log import Run

if TYPE_CHECKING:
    from ..app import App
    from ..execution.processes import ProcessPool
    from ..execution.threads import ThreadRunner
    from .completer import Completer
    from .lease import Lease
    from .metrics import WorkerMetrics
    from .signals import Signals

logger = logging.getLogger("akadze.worker")

# complete_tx (a success), or a Celery task that stored its own outcome before
# task_postrun (any outcome): not known here.
_WRITTEN_BY_TASK = "job %s %s ended in %.6fs (attempt %s, outcome written by the task)"
_RUNS_ON = ("job %s: terminate requested, but this worker runs bodies in threads, which "
            "cannot be stopped: it runs on (it ends cancelled if it raises)")
# How many cancels of jobs not held a worker keeps (``Runs._hear``).
_HEARD = 1024


def _named_task(loop: asyncio.AbstractEventLoop, coro: Any, name: str) -> asyncio.Task[Any]:
    """``loop.create_task(coro, name=name)``, for a loop that cannot make eager tasks."""
    return loop.create_task(coro, name=name)


class Runs:
    """The runs one worker holds. ``open`` hands it the completer its outcomes go to and
    the threads sync bodies run in, once the worker has started."""

    def __init__(self, app: App, signals: Signals, lease: Lease, *, queues: Iterable[str],
                 process_pool: ProcessPool | None, concurrency: int | None,
                 outcome_log_level: int) -> None:
        self._app = app
        self._signals = signals
        self._lease = lease
        self._process_pool = process_pool
        self.outcome_log_level = outcome_log_level
        #: The runs held, by job id.
        self.running: dict[int, Run] = {}
        #: Runs whose terminate request was acted on (signal sent, or warned about).
        self.terminating: set[int] = set()
        #: The concurrency gate, where the runs claimed ahead wait (claimed, not started).
        self.bodies = BodyGate(concurrency) if concurrency is not None else None
        # No process pool and no concurrency limit: a gate of each queue's slots (made by
        # ``limit``), where the runs claimed ahead of them wait. None: the runs wait in the
        # pool or in ``bodies``, or not at all.
        self._queue_gates: dict[str, BodyGate] | None = (
            {} if process_pool is None and concurrency is None else None)
        # How many runs in a row took less than SHORT from their claim to their end.
        self._short_in_row = 0
        #: Runs held per queue.
        self.busy = dict.fromkeys(queues, 0)
        #: Runs whose outcome waits in the completer, for the one log line per outcome.
        self.finished: dict[tuple[int, int], Run] = {}
        #: Runs started (claimed) since the worker started, by task name.
        self.accepted: collections.Counter[str] = collections.Counter()
        #: This worker's Prometheus series, else None.
        self.metrics: WorkerMetrics | None = None
        self._completer: Completer | None = None
        self._threads: ThreadRunner | None = None
        # Set while ``ended`` waits: a run driven by callbacks ended.
        self._emptied: asyncio.Future[None] | None = None
        # The ids of jobs not held whose cancel was heard, oldest first (a bounded set).
        self._heard: collections.OrderedDict[int, None] = collections.OrderedDict()

    def open(self, completer: Completer, threads: ThreadRunner) -> None:
        """Runs start from now on: outcomes go to ``completer``, sync bodies to ``threads``."""
        self._completer = completer
        self._threads = threads

    def held(self) -> dict[int, bool]:
        """The jobs held, by id: True for those whose body runs, False for those claimed
        ahead and waiting for a body slot or a process."""
        return {job_id: not self.waiting(job_id) for job_id in self.running}

    def waiting(self, job_id: int) -> bool:
        """Whether the run was claimed ahead and has not started (no body, no attempt)."""
        if self._process_pool is not None:
            return self._process_pool.waiting(job_id)
        gate = self._gate_of(job_id)
        if gate is None:
            return False
        if gate.waiting(job_id):
            return True
        # A run in a task waits from its claim on: its task may not have reached the gate.
        run = self.running.get(job_id)
        return run is not None and run.future is not None and not run.entered

    def _gate(self, queue: str) -> BodyGate | None:
        """Where the runs of ``queue`` wait for a body slot, if anywhere."""
        gates = self._queue_gates
        return self.bodies if gates is None else gates.get(queue)

    def _gate_of(self, job_id: int) -> BodyGate | None:
        """Where the run of ``job_id`` (held, or not known) waits, if anywhere."""
        gates = self._queue_gates
        if gates is None:
            return self.bodies
        run = self.running.get(job_id)
        return gates.get(run.queue) if run is not None else None

    def limit(self, queue: str, slots: int) -> None:
        """``queue`` runs at most ``slots`` bodies at once (its claim is about to be made):
        a worker that claims ahead holds its runs to that in the queue's gate. More start
        waiting runs at once; fewer take effect as runs end."""
        gates = self._queue_gates
        if gates is None:
            return
        gate = gates.get(queue)
        if gate is None:
            gates[queue] = BodyGate(slots)
        elif gate.slots != slots:
            gate.resize(slots)

    def ahead(self, slots: int) -> int:
        """How many runs of a queue of ``slots`` may be claimed beyond them now: one more
        claim's worth while the last ``slots`` runs in a row each ended within ``SHORT`` of
        their claim and the oldest run held is younger than that (so what waits never waits
        long behind a slow body); else none, as for a process pool (``ProcessPool.ahead``).
        Always none for a worker whose runs wait in a pool or a concurrency gate."""
        if self._queue_gates is None or self._short_in_row < slots:
            return 0
        for run in self.running.values():  # the oldest claim first
            if time.monotonic() - run.started >= SHORT:
                return 0
            break
        return slots

    def _took(self, run: Run) -> None:
        """Count ``run``, which just ended, into the streak of short runs."""
        if time.monotonic() - run.started < SHORT:
            self._short_in_row += 1
        else:
            self._short_in_row = 0

    # --- from the claim to the outcome --------------------------------------------------------

    def start(self, row: dict[str, Any]) -> None:
        """Start the run of a claimed job ``row``.

        A process pool's run and a sync body without a timeout are driven by callbacks
        (the pool's reader, the thread runner's delivery, the body gate's hand-over): no
        task and no coroutine per job, the worker's biggest per-job costs after the
        claim. The others (async bodies, a task timeout) run in a task (``_run_job``)."""
        job_id = row["id"]
        queue = row["queue"]
        name = row["task"]
        self.accepted[name] += 1
        if self.metrics is not None:
            self.metrics.claimed(row)
        self.busy[queue] += 1
        # Every argument by position (no task or timer yet): a keyword made the dataclass's
        # call a third slower, once a job.
        run = self.running[job_id] = Run(job_id, row["run_count"], queue, name,
                                         row["attempt"], row["max_attempts"],
                                         time.monotonic(), None, row["claim_token"], None, row)
        if self._heard and job_id in self._heard:
            del self._heard[job_id]
            logger.info("job %s %s was cancelled while its claim was on its way: it is not "
                        "started", job_id, name)
            self._end_soon(run, Outcome(job_id, run.run_count, UNSTARTED,
                                        claim_token=run.claim_token))
            return
        expires_at = row.get("expires_at")
        if expires_at is not None:
            # Both times are the database's (the claim's now() is started_at): only the
            # duration is carried over to this clock, and the database judges when it fires.
            left = (expires_at - row["started_at"]).total_seconds()
            run.timer = asyncio.get_running_loop().call_later(left, self.expired, job_id)
        pool = self._process_pool
        if pool is not None:
            try:
                pool.submit(self._app, row, self._lease.worker_id, self._pool_ended)
            except Exception as exc:
                self._end_soon(run, self._internal(row, exc))
            return
        task = self._app.tasks.get(name)
        if task is None or task.is_async or task.timeout is not None:
            bodies = self._gate(queue)
            if bodies is None or bodies.try_enter():  # its task holds the slot taken here
                # asyncio.create_task without its layer: the loop's own create_task, which
                # names the task as it makes it (a task factory still applies).
                run.future = asyncio.get_running_loop().create_task(
                    self._run_job(row, run, bodies), name=f"job-{job_id}")
                return
            # It waits in line (claimed ahead, or the gate is full) with no task yet: one
            # is made when it is handed a slot (_task_handed), in a copy of the claimer's
            # context variables, as one made here would have been. The next claim goes
            # out before the task steps of the runs it held.
            run.variables = contextvars.copy_context()
            bodies.wait(job_id, self._task_handed, run)
            return
        # The body's thread runs in a copy of the claimer's context variables, as a task
        # made here would have.
        run.variables = contextvars.copy_context()
        bodies = self._gate(queue)
        if bodies is None or bodies.try_enter():
            self._begin(run)
        else:
            bodies.wait(job_id, self._handed, run)

    def start_many(self, rows: list[dict[str, Any]]) -> None:
        """Start the runs of a claim's ``rows``, in their order; a row the claim found
        cancelled is not started.

        Each row is ``start``-ed, the common one (no process pool, an async body with no
        timeout, no expiry, a free body slot, no cancel heard) on a short path with every
        lookup made once per claim, not once per row, its task taking its first step here
        (``execution.eager``: a body that does not wait has ended when the next row starts);
        any other row goes through ``start`` itself."""
        if not rows:
            return
        loop = asyncio.get_running_loop()
        # Each row's task takes its first step here, where the loop allows it: a short body
        # ends within this call, without a turn of the loop of its own.
        with eager_tasks(loop) as make:
            self._start_rows(rows, make or partial(_named_task, loop))

    def _start_rows(self, rows: list[dict[str, Any]], make: MakeTask) -> None:
        """``start_many``'s rows, their tasks made by ``make``."""
        heard = self._heard
        pooled = self._process_pool is not None
        accepted = self.accepted
        metrics = self.metrics
        busy = self.busy
        running = self.running
        tasks = self._app.tasks
        run_job = self._run_job
        monotonic = time.monotonic
        # The gate of the queue of the last row (a claim's rows share a queue).
        gate_queue: str | None = None
        gate: BodyGate | None = None
        for row in rows:
            job_id = row["id"]
            if row["state"] == "cancelled":
                logger.info("job %s %s cancelled before it started", job_id, row["task"])
                continue
            name = row["task"]
            task = tasks.get(name)
            if (pooled or task is None or not task.is_async or task.timeout is not None
                    or row.get("expires_at") is not None or (heard and job_id in heard)):
                self.start(row)
                continue
            queue = row["queue"]
            if queue != gate_queue:
                gate_queue = queue
                gate = self._gate(queue)
            if gate is not None and not gate.try_enter():
                self.start(row)  # it waits in line
                continue
            # As ``start`` does, in its order.
            accepted[name] += 1
            if metrics is not None:
                metrics.claimed(row)
            busy[queue] += 1
            run = running[job_id] = Run(job_id, row["run_count"], queue, name, row["attempt"],
                                        row["max_attempts"], monotonic(), None,
                                        row["claim_token"], None, row)
            future = make(run_job(row, run, gate), f"job-{job_id}")
            if not future.done():
                # A task that ended in its first step is not kept: the run has ended, and
                # its task, coroutine and row are freed now, while they are in the cache,
                # not when its line is written.
                run.future = future

    def _handed(self, run: Run, slot: bool) -> None:
        """The body gate's answer to a run waiting in it: a slot (it starts now), or
        dropped (it ends unstarted)."""
        if slot:
            self._begin(run)
        else:
            self._end(run, Outcome(run.job_id, run.run_count, UNSTARTED,
                                   claim_token=run.claim_token))

    def _task_handed(self, run: Run, slot: bool) -> None:
        """The body gate's answer to a run in a task waiting in it with no task yet: a slot
        (its task starts now, holding it), or dropped (it ends unstarted)."""
        if not slot:
            self._end(run, Outcome(run.job_id, run.run_count, UNSTARTED,
                                   claim_token=run.claim_token))
            return
        assert run.row is not None
        # It holds the slot; it still waits (waiting(), a cancel drops it) until its task
        # takes its first step, as a run whose task was made at its claim.
        # It runs in the copy of the claimer's context variables made at the claim, as a
        # task made there would have (that copy is this run's alone).
        variables = run.variables
        assert variables is not None
        run.variables = None
        job = self._run_job(run.row, run, self._gate(run.queue))
        if sys.version_info >= (3, 11):
            # The loop's create_task takes the context and the name as it makes the task:
            # no second copy of the context, no asyncio.create_task layer.
            run.future = asyncio.get_running_loop().create_task(
                job, name=f"job-{run.job_id}", context=variables)
        else:
            run.future = variables.run(asyncio.create_task, job, name=f"job-{run.job_id}")
        # ended() waits on the runs' tasks: this run has one now.
        if self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)

    def _begin(self, run: Run) -> None:
        """Hand the sync body of ``run`` (holding a body slot, if there is a gate) to a
        thread; a run that cannot start ends on the next loop turn (never inside the
        gate's hand-over, which a run's end calls)."""
        row = run.row
        assert row is not None and self._threads is not None and run.variables is not None
        try:
            early, task, context, args = prepare(self._app, row, self._lease.worker_id)
            if context is None:
                self._end_soon(run, early, True)
                return
            run.variables.run(set_current, context)
            run.body = task
            run.context = context
            self._threads.call(self._body_ended, run, run.variables.run, task.func, **args)
        except Exception as exc:
            self._end_soon(run, self._internal(row, exc), True)

    def _body_ended(self, run: Run, value: Any, error: BaseException | None) -> None:
        """A sync body's thread ended: its outcome, as ``_run_job`` makes it."""
        if self.running.get(run.job_id) is not run:
            return  # taken back while its body ran (the worker stops): its result is dropped
        row = run.row
        assert row is not None
        app = self._app
        try:
            if error is None:
                outcome = returned_outcome(app, run.context, run.body, row, value)
            elif isinstance(error, asyncio.CancelledError):
                if self._signals.stop.is_set():
                    # As a task's run cancelled while stopping: back to the queue unspent.
                    self._end(run, None, True, unspent=True)
                    return
                outcome = raised(row["id"], row["run_count"], row["attempt"], error, None,
                                 app.redact, claim_token=row["claim_token"])
            else:
                outcome = raised_outcome(run.context, run.body, row, error)
        except Exception as exc:
            outcome = self._internal(row, exc)
        self._end(run, outcome, True)

    def _pool_ended(self, row: Mapping[str, Any], outcome: Outcome | None,
                    error: Exception | None) -> None:
        """The process pool's word on a submitted run: its outcome, or an internal error."""
        run = self.running.get(row["id"])
        if run is None or run.row is not row:
            return
        if error is not None:
            outcome = self._internal(row, error)
        self._end(run, outcome)

    def _internal(self, row: Mapping[str, Any], exc: BaseException) -> Outcome:
        """A bug in akadze itself while running ``row``: keep the job, spend the attempt."""
        logger.error("job %s: internal error while running it", row["id"], exc_info=exc)
        return Outcome(row["id"], row["run_count"], RETRY,
                       delay=default_backoff(row["attempt"]),
                       error=error_entry(exc, redact=self._app.redact),
                       claim_token=row["claim_token"])

    def _end_soon(self, run: Run, outcome: Outcome | None, slot: bool = False) -> None:
        """``_end`` on the next loop turn, unless the run is taken back before."""
        def end() -> None:
            if self.running.get(run.job_id) is run:
                self._end(run, outcome, slot)
        asyncio.get_running_loop().call_soon(end)

    def _end(self, run: Run, outcome: Outcome | None, slot: bool = False, *,
             unspent: bool = False) -> None:
        """A run driven by callbacks ended: what ``_run_job`` does after its body.
        ``slot``: it holds a body slot, passed on now; ``unspent``: taken back while the
        worker stops, no outcome (the job goes back to the queue)."""
        job_id = run.job_id
        del self.running[job_id]
        self.terminating.discard(job_id)
        if run.timer is not None:
            run.timer.cancel()
        self.busy[run.queue] -= 1
        self._signals.wake.set()
        if self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)
        if self._queue_gates is not None:
            self._took(run)
        if slot:
            gate = self._gate(run.queue)
            if gate is not None:
                gate.release()  # may begin a waiting run now
        if unspent:
            return
        if self.metrics is not None:
            self.metrics.ran(run, outcome)
        if outcome is not None:
            assert self._completer is not None and run.row is not None
            self.finished[(job_id, run.run_count)] = run
            self._completer.submit(outcome, urgent=bool(run.row.get("releases")))
            run.row = None  # as a task's run: its line needs only the run's own fields
        else:
            logger.log(self.outcome_log_level, _WRITTEN_BY_TASK, job_id, run.task,
                       time.monotonic() - run.started, run.attempt)

    def cancel(self, run: Run) -> None:
        """The worker stops: take ``run`` back (it waits to start, or its body runs too long
        to wait for). No outcome: the job goes back to the queue unspent. A process pool's
        running body ends with its process; a sync body's thread cannot be stopped, it runs
        on and its result is dropped. A task's run is cancelled (await its ``future``)."""
        if run.future is not None:
            if not self._turn_away(run, "taken back"):
                run.future.cancel()
            return
        if self.running.get(run.job_id) is not run:
            return
        slot = False
        if self._process_pool is not None:
            self._process_pool.cancel(run.job_id)
        else:
            gate = self._gate(run.queue)
            slot = gate is not None and not gate.leave(run.job_id)
        self._end(run, None, slot, unspent=True)

    async def ended(self) -> None:
        """Wait until no run is held (the worker stops and takes no more)."""
        while self.running:
            tasks = [run.future for run in self.running.values() if run.future is not None]
            if tasks:
                await asyncio.wait(tasks)
                continue
            self._emptied = asyncio.get_running_loop().create_future()
            try:
                await self._emptied
            finally:
                self._emptied = None

    async def _run_job(self, row: dict[str, Any], held: Run, bodies: BodyGate | None) -> None:
        """The task of ``held``, the run of claimed ``row``: its body, then its end.
        ``bodies``: the gate its task was made holding a slot of (its queue's, which a
        queue keeps once made), if there is one.

        The body is awaited by this one frame, with no coroutine of the executor's between
        them: every step of a coroutine resumes each frame under it."""
        app = self._app
        assert self._completer is not None and self._threads is not None
        outcome: Outcome | None
        try:
            if bodies is not None and held.turned_away is not None:
                bodies.release()  # turned away before its first step: unused
                if held.turned_away == "taken back":
                    return  # the worker stops: the job goes back to the queue unspent
                # Dropped while it waited: cancelled or expired.
                outcome = Outcome(row["id"], row["run_count"], UNSTARTED,
                                  claim_token=row["claim_token"])
            else:
                # Its task was made holding a body slot, if there is a gate (start,
                # _task_handed): released once the body ended, however it ended.
                held.entered = True
                try:
                    early, task, context, args = prepare(app, row, self._lease.worker_id)
                    if context is None:
                        outcome = early
                    else:
                        token = CURRENT.set(context)
                        returned = False
                        try:
                            if task.is_async and task.timeout is None:
                                value = await task.func(**args)  # call_body's common case
                            else:
                                value = await call_body(task, args, self._threads)
                            returned = True
                        except asyncio.CancelledError:
                            raise
                        except BaseException as exc:  # a body's SystemExit must not stop us
                            outcome = raised_outcome(context, task, row, exc)
                        finally:
                            CURRENT.reset(token)
                        if returned:
                            outcome = returned_outcome(app, context, task, row, value)
                finally:
                    if bodies is not None:
                        bodies.release()
        except asyncio.CancelledError as exc:
            if self._signals.stop.is_set():
                return  # stopping: the job goes back to the queue unspent
            # The body cancelled itself (not us): an exception like any other.
            outcome = raised(row["id"], row["run_count"], row["attempt"], exc, None,
                             app.redact, claim_token=row["claim_token"])
        except Exception as exc:  # a bug in akadze itself: keep the job, spend the attempt
            logger.exception("job %s: internal error while running it", row["id"])
            outcome = Outcome(row["id"], row["run_count"], RETRY,
                              delay=default_backoff(row["attempt"]),
                              error=error_entry(exc, redact=app.redact),
                              claim_token=row["claim_token"])
        finally:
            run = self.running.pop(row["id"], None)
            self.terminating.discard(row["id"])
            if run is not None:
                if run.timer is not None:
                    run.timer.cancel()
                if self._queue_gates is not None:
                    self._took(run)
            self.busy[row["queue"]] -= 1
            self._signals.wake.set()
        if self.metrics is not None and run is not None:
            self.metrics.ran(run, outcome)
        if outcome is not None:
            if run is not None:
                self.finished[(run.job_id, run.run_count)] = run
                run.row = None  # its line needs only the run's own fields
            self._completer.submit(outcome, urgent=bool(row.get("releases")))
        elif run is not None:
            logger.log(self.outcome_log_level, _WRITTEN_BY_TASK, run.job_id, run.task,
                       time.monotonic() - run.started, run.attempt)

    # --- cancel and expiry of runs claimed ahead ------------------------------------------------

    def drop(self, job_id: int, why: str) -> bool:
        """Drop the run of ``job_id`` if it still waits to start: it ends unstarted."""
        # Read first: a run driven by callbacks has ended once dropped.
        run = self.running.get(job_id)
        if self._process_pool is not None:
            dropped = self._process_pool.drop(job_id)
        else:
            dropped = run is not None and self._turn_away(run, "dropped")
        if dropped:
            logger.info("job %s %s %s while claimed ahead: it is not started", job_id,
                        run.task if run else "", why)
        return dropped

    def give_back(self, cap: int) -> int:
        """A cap on runs was set while running: the runs claimed ahead beyond it that wait
        at their queue's gate are dropped, newest first, and go back to the queue unspent
        (the gates bound each queue's bodies, not the runs across queues). A process pool
        or a concurrency gate bounds its own bodies: nothing to do there. How many went."""
        if self._queue_gates is None:
            return 0
        excess = len(self.running) - cap
        given = 0
        for job_id in reversed(list(self.running)):  # a run driven by callbacks ends here
            if given >= excess:
                break
            if self.waiting(job_id) and self.drop(job_id, "was handed back (a cap on runs "
                                                          "was set)"):
                given += 1
        return given

    def _turn_away(self, run: Run, why: str) -> bool:
        """End a run that waits at its body gate without its body, ``why`` being
        ``Run.turned_away``'s: a run driven by callbacks is dropped from the gate's line
        (it is there from its claim on); a run in a task is told, whether its task waits
        there or has not taken its first step. False when its body started, or it has no
        gate."""
        gate = self._gate(run.queue)
        if gate is None:
            return False
        if run.future is None:
            return gate.drop(run.job_id)
        if run.entered or run.turned_away is not None:
            return False
        run.turned_away = why
        gate.drop(run.job_id)  # its task, if it waits there, wakes and ends
        return True

    def cancelled(self, job_id: int) -> None:
        """A cancel of running job ``job_id`` was requested (NOTIFY): any worker hears it;
        only the one holding it claimed ahead does something."""
        if job_id in self.running:
            self.drop(job_id, "was cancelled")
        else:
            self._hear(job_id)

    def _hear(self, job_id: int) -> None:
        """Keep a cancel (plain or with terminate: either keeps it from starting) of a job
        not held here, in case this worker's claim of it is on its way: the claim committed before
        the cancel was asked (it waited for the claim's row lock), and the notice may come
        in before the claim's answer. The claim checked the cancel too early, and nothing
        else would until the next heartbeat. A few are kept: a job heard of but claimed
        by no one here only costs its place."""
        heard = self._heard
        heard[job_id] = None
        if len(heard) > _HEARD:
            heard.popitem(last=False)

    def terminate(self, job_id: int, signum: int) -> None:
        """A cancel with terminate of running job ``job_id`` (NOTIFY, or the heartbeat's
        check): a process pool sends ``signum`` to the process running its body. Bodies run
        in this process (threads, the event loop) cannot be stopped: there it is a cancel
        request like any other."""
        if job_id not in self.running:
            self._hear(job_id)
            return
        if self._process_pool is not None:
            if job_id not in self.terminating:
                if self._process_pool.terminate(job_id, signum):
                    if job_id in self.running:  # not dropped (and so ended) by it
                        self.terminating.add(job_id)
                else:
                    # Held here, but not by the pool (the request came in between): again
                    # on the next turn. Not marked acted on, so the heartbeat's check still
                    # covers it if that finds nothing either.
                    asyncio.get_running_loop().call_soon(self._terminate_handed, job_id,
                                                         signum)
        elif not self.drop(job_id, "was cancelled") and job_id not in self.terminating:
            self.terminating.add(job_id)
            logger.warning(_RUNS_ON, job_id)

    def _terminate_handed(self, job_id: int, signum: int) -> None:
        """``terminate``'s second try for a process pool's run, on the next loop turn."""
        if job_id not in self.running or job_id in self.terminating:
            return
        assert self._process_pool is not None
        if self._process_pool.terminate(job_id, signum) and job_id in self.running:
            self.terminating.add(job_id)

    def expired(self, job_id: int) -> None:
        """The expiry timer of a run fired: drop it if it still waits."""
        run = self.running.get(job_id)
        if run is not None:
            run.timer = None
            self.drop(job_id, "expired")

    async def check_waiting(self, guard: Guard) -> None:
        """Every heartbeat, while runs wait: one statement finds those cancelled or expired
        meanwhile, in case a notification was lost with the LISTEN connection."""
        waiting = [run.fence for run in self.running.values() if self.waiting(run.job_id)]
        # A process pool's running bodies: terminate requests missed the same way.
        started = [run.fence for run in self.running.values()
                   if self._process_pool is not None and not self.waiting(run.job_id)
                   and run.job_id not in self.terminating]
        if not waiting and not started:
            return
        found: list[int] = []
        terminate: list[tuple[int, int]] = []

        async def check(connection: psycopg.AsyncConnection) -> None:
            if waiting:
                found.extend(await database.list_revoked(connection, waiting))
            if started:
                terminate.extend(await database.list_terminating(connection, started))

        if await guard(check, "cancel check"):
            for job_id in found:
                self.drop(job_id, "was cancelled or expired")
            for job_id, signum in terminate:
                self.terminate(job_id, signum)


__all__ = ["Runs"]
