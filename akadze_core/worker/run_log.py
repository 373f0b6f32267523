"""The worker's one line per finished run: what became of it, and for a failure its error
and what happens next (the traceback at DEBUG only)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..model.outcomes import FAIL, RETRY, SUCCESS, Outcome, error_summary, parse_error

logger = logging.getLogger("akadze.worker")


@dataclass(slots=True)
class Run:
    """A run this worker holds: claimed, running or waiting to start, until its outcome
    is written."""

    job_id: int
    run_count: int
    queue: str
    task: str
    attempt: int
    max_attempts: int
    started: float
    #: The task running it, for a run that needs one (an async body, a timeout); None
    #: for the runs ``Runs`` drives by callbacks (a process pool's, a sync body's).
    future: asyncio.Task[None] | None = None
    #: The claim's fencing token (the row's claim_token).
    claim_token: int | None = None
    # Fires when the job expires (a job with expires_at only): if it still waits, it is
    # dropped unstarted.
    timer: asyncio.TimerHandle | None = None
    #: The claimed row.
    row: dict[str, Any] | None = None
    #: A sync body run by callbacks: its task, its JobContext and the context variables
    #: its thread runs in (for a run in a task that waits for a body slot before its task
    #: is made: those its task will run in).
    body: Any = None
    context: Any = None
    variables: contextvars.Context | None = None
    #: A run in a task behind a body gate: its task took a body slot (its body started).
    #: Until then it waits, whether or not its task has taken its first step.
    entered: bool = False
    #: A run in a task, told before it took a slot to end without its body: ``"dropped"``
    #: (cancelled or expired: the unstarted outcome) or ``"taken back"`` (the worker
    #: stops: no outcome, the job goes back unspent).
    turned_away: str | None = None

    @property
    def fence(self) -> tuple[int, int, int | None]:
        """(job id, run count, claim token): what a write for this run must match."""
        return self.job_id, self.run_count, self.claim_token


def log_outcomes(batch: Iterable[Outcome], rows: list[dict[str, Any]],
                 finished: dict[tuple[int, int], Run], level: int,
                 redact: Callable[[str], str],
                 on_unregistered: Callable[[int, str], None] | None) -> None:
    """The one line per outcome of a written ``batch`` (``rows``: those that changed), at
    ``level``; a failure also says what happens next (see ``log_failure``). Pops each
    outcome's run from ``finished``."""
    changed = {(row["id"], row["run_count"]): row["state"] for row in rows}
    # Checked once per batch: when the level is off, the lines cost nothing to skip.
    info = logger.isEnabledFor(level)
    write = _line_writer(level) if info else None
    # The success lines for ``write``, written before any other line so that they stay in
    # order.
    lines: list[str] = []
    append = lines.append
    pop = finished.pop
    now = time.monotonic()
    for outcome in batch:
        job_id = outcome.job_id
        key = (job_id, outcome.run_count)
        run = pop(key, None)
        state = changed.get(key)
        if write is not None and run is not None and state is not None \
                and outcome.error is None:
            # The common line (a run of this worker, changed, no error) made in one format:
            # SUCCEEDED's text, with the label and the time as below.
            label = f"job {job_id} {run.task}".rstrip()
            append(f"{label} {state} in {now - run.started:.6f}s "
                   f"(attempt {run.attempt}, {outcome.kind})")
            continue
        # An unknown task is said whatever the level (a FAIL outcome: rare, never a success).
        if state is not None and not info and outcome.kind != FAIL:
            continue
        label = f"job {outcome.job_id} {run.task if run else ''}".rstrip()
        # Microseconds: a fast body takes well under a millisecond.
        took = f" in {now - run.started:.6f}s" if run else ""
        if state is not None and (outcome.error is None or outcome.kind == SUCCESS):
            args = (label, state, took, run.attempt if run else "?", outcome.kind)
            if write is not None:
                append(SUCCEEDED % args)
            else:
                # _log skips the level check: made once per batch above.
                (_log if info else logger.log)(level, SUCCEEDED, *args)
            continue
        if lines and write is not None:
            write(lines)
            lines = []
            append = lines.append
        if state is None:
            logger.warning("%s: outcome of run %s rejected, the run no longer owns the job",
                           label, outcome.run_count)
        else:
            log_failure(outcome, run, state, label, took, info, level, redact,
                        on_unregistered)
    if lines and write is not None:
        write(lines)


#: The line of a run that ended without an error (or succeeded despite one).
SUCCEEDED = "%s %s%s (attempt %s, %s)"


def _line_writer(level: int) -> Callable[[list[str]], None] | None:
    """The writer of lines (``StderrHandler.line_writer``) of the one handler that would
    see the records ``logger`` makes at ``level``, when nothing else would: no filter on
    ``logger``, no other handler up its chain, ``logging.Logger``'s own methods (Sentry's
    logging integration wraps ``callHandlers`` to see every record). Else None: each line
    is a record, as any logging call's."""
    if (type(logger) is not logging.Logger or logger.disabled or logger.filters
            or not all(_logging_own(method)
                       for method in (logging.Logger.handle, logging.Logger.callHandlers,
                                      logging.Logger.makeRecord))):
        return None
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        handlers.extend(handler for handler in current.handlers if level >= handler.level)
        current = current.parent if current.propagate else None
    offer = getattr(handlers[0], "line_writer", None) if len(handlers) == 1 else None
    return offer(logger.name, level) if offer is not None else None


def _logging_own(method: Any) -> bool:
    # A wrapper (a function of another module, a partial) is someone watching the records.
    code = getattr(method, "__code__", None)
    return code is not None and code.co_filename == logging.__file__


def _log(level: int, msg: str, *args: Any) -> None:
    """``logger.log(level, msg, *args)`` for a caller that checked ``isEnabledFor(level)``:
    the same record (made by ``makeRecord``, so a record factory still applies; the caller's
    file, line and function), without ``findCaller``'s walk up the stack, a tenth of the
    cost of each of the worker's lines per job."""
    if logging._srcfile is None:  # caller information turned off, as Logger._log honours
        logger.handle(logger.makeRecord(logger.name, level, "(unknown file)", 0, msg, args,
                                        None, "(unknown function)"))
        return
    caller = sys._getframe(1)
    code = caller.f_code
    logger.handle(logger.makeRecord(logger.name, level, code.co_filename, caller.f_lineno,
                                    msg, args, None, code.co_name))


def log_failure(outcome: Outcome, run: Run | None, state: str, label: str, took: str,
                info: bool, level: int, redact: Callable[[str], str],
                on_unregistered: Callable[[int, str], None] | None) -> None:
    """The one line of a run that ended with an error: its type and message, and what
    happens next; the traceback (stored in the job's errors) follows at DEBUG only."""
    entry = parse_error(outcome.error)
    if entry.get("type") == "NotRegistered" and run is not None:
        if on_unregistered is not None:
            try:
                on_unregistered(outcome.job_id, run.task)
            except Exception:  # the outcome is written: a broken hook must not stop us
                logger.exception("%s: the on_unregistered hook raised", label)
        else:
            logger.warning("%s %s: NotRegistered: no task %r in this worker (is the "
                           "module that defines it imported by the app?)", label, state,
                           run.task)
        return
    if not info:
        return
    summary = error_summary(entry, redact)
    if run is not None:
        budget = max(run.max_attempts, outcome.max_attempts or 0)
        attempt = f"attempt {run.attempt}/{budget}"
    else:
        attempt = "attempt ?"
    if state == "queued":
        logger.log(level, "%s failed %s%s: %s (retry in %.1fs)", label,
                   attempt, took, summary, outcome.delay)
    elif state == "failed":
        # Out of attempts, or failed on purpose (Fail, bad args): no attempt follows.
        why = "no attempts left" if outcome.kind == RETRY else "not retried"
        logger.log(level, "%s failed for good on %s%s: %s (%s)", label,
                   attempt, took, summary, why)
    else:  # cancelled: a Cancel, or any error once a cancel was requested or it expired
        logger.log(level, "%s %s on %s%s: %s", label, state, attempt,
                   took, summary)
    traceback = entry.get("traceback")
    if traceback and logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s traceback of %s:\n%s", label, attempt,
                     redact(str(traceback)).rstrip())
