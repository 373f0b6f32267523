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
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from ..execution.executor import execute
from ..execution.gate import BodyGate
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
        return self.bodies is not None and self.bodies.waiting(job_id)

    # --- from the claim to the outcome --------------------------------------------------------

    def start(self, row: dict[str, Any]) -> None:
        """Start the run of a claimed job ``row``."""
        queue = row["queue"]
        self.accepted[row["task"]] += 1
        if self.metrics is not None:
            self.metrics.claimed(row)
        self.busy[queue] += 1
        future = asyncio.create_task(self._run_job(row), name=f"job-{row['id']}")
        run = self.running[row["id"]] = Run(row["id"], row["run_count"], queue, row["task"],
                                            row["attempt"], row["max_attempts"],
                                            time.monotonic(), future, row["claim_token"])
        expires_at = row.get("expires_at")
        if expires_at is not None:
            # Both times are the database's (the claim's now() is started_at): only the
            # duration is carried over to this clock, and the database judges when it fires.
            left = (expires_at - row["started_at"]).total_seconds()
            run.timer = asyncio.get_running_loop().call_later(left, self.expired, row["id"])

    async def _run_job(self, row: dict[str, Any]) -> None:
        app = self._app
        worker_id = self._lease.worker_id
        assert self._completer is not None and self._threads is not None
        try:
            if self._process_pool is not None:
                outcome = await self._process_pool.execute(app, row, worker_id)
            elif self.bodies is not None:
                if await self.bodies.enter(row["id"]):
                    try:
                        outcome = await execute(app, row, worker_id, self._threads)
                    finally:
                        self.bodies.release()
                else:  # dropped while it waited: cancelled or expired
                    outcome = Outcome(row["id"], row["run_count"], UNSTARTED,
                                      claim_token=row["claim_token"])
            else:
                outcome = await execute(app, row, worker_id, self._threads)
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
            if run is not None and run.timer is not None:
                run.timer.cancel()
            self.busy[row["queue"]] -= 1
            self._signals.wake.set()
        if self.metrics is not None and run is not None:
            self.metrics.ran(run, outcome)
        if outcome is not None:
            if run is not None:
                self.finished[(run.job_id, run.run_count)] = run
            self._completer.submit(outcome, urgent=bool(row.get("releases")))
        elif run is not None:
            logger.log(self.outcome_log_level,
                       # complete_tx (a success), or a Celery task that stored its own
                       # outcome before task_postrun (any outcome): not known here
                       "job %s %s ended in %.6fs (attempt %s, outcome written by the task)",
                       run.job_id, run.task, time.monotonic() - run.started, run.attempt)

    # --- cancel and expiry of runs claimed ahead ------------------------------------------------

    def drop(self, job_id: int, why: str) -> bool:
        """Drop the run of ``job_id`` if it still waits to start: it ends unstarted."""
        if self._process_pool is not None:
            dropped = self._process_pool.drop(job_id)
        else:
            dropped = self.bodies is not None and self.bodies.drop(job_id)
        if dropped:
            run = self.running.get(job_id)
            logger.info("job %s %s %s while claimed ahead: it is not started", job_id,
                        run.task if run else "", why)
        return dropped

    def cancelled(self, job_id: int) -> None:
        """A cancel of running job ``job_id`` was requested (NOTIFY): any worker hears it;
        only the one holding it claimed ahead does something."""
        if job_id in self.running and not self.drop(job_id, "was cancelled"):
            # Started, or claimed so recently that its run's task has not handed it to the
            # pool or the body slots yet: once more on the next loop turn, for the latter.
            asyncio.get_running_loop().call_soon(self._cancelled_handed, job_id)

    def _cancelled_handed(self, job_id: int) -> None:
        """``cancelled``'s second try, after the run's task has started."""
        if job_id in self.running:
            self.drop(job_id, "was cancelled")

    def terminate(self, job_id: int, signum: int) -> None:
        """A cancel with terminate of running job ``job_id`` (NOTIFY, or the heartbeat's
        check): a process pool sends ``signum`` to the process running its body. Bodies run
        in this process (threads, the event loop) cannot be stopped: there it is a cancel
        request like any other."""
        if job_id not in self.running:
            return
        if self._process_pool is not None:
            if job_id not in self.terminating:
                if self._process_pool.terminate(job_id, signum):
                    self.terminating.add(job_id)
                else:
                    # Claimed, but its run's task has not handed it to the pool yet (the
                    # request came in between): again once it has. Not marked acted on, so
                    # the heartbeat's check still covers it if that finds nothing either.
                    asyncio.get_running_loop().call_soon(self._terminate_handed, job_id,
                                                         signum)
        elif not self.drop(job_id, "was cancelled") and job_id not in self.terminating:
            # Running, or not handed to the body slots yet: told apart on the next turn.
            asyncio.get_running_loop().call_soon(self._terminate_handed, job_id, signum)

    def _terminate_handed(self, job_id: int, signum: int) -> None:
        """``terminate``'s second try, after the run's task has started."""
        if job_id not in self.running or job_id in self.terminating:
            return
        if self._process_pool is not None:
            if self._process_pool.terminate(job_id, signum):
                self.terminating.add(job_id)
        elif not self.drop(job_id, "was cancelled"):
            self.terminating.add(job_id)
            logger.warning("job %s: terminate requested, but this worker runs bodies in "
                           "threads, which cannot be stopped: it runs on (it ends "
                           "cancelled if it raises)", job_id)

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
