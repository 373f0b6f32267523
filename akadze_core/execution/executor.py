"""Run one claimed job and classify how it ended (River's executor, in asyncio)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ..model import outcomes
from ..model.errors import Fail, JobTimeout
from ..model.jobs import Job
from ..model.serialization import fast_loads
from .context import JobContext, reset_current, set_current
from .threads import ThreadRunner

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.worker")


def decode_job(app: App, row: dict[str, Any]) -> tuple[Job, str | None]:
    """The Job of a claimed row, and a decode error message if its args are unusable.

    Args arrive as raw JSON text and are decoded here with the app's loader, so a row
    written by hand (garbage, a pickle blob in a string) fails cleanly: nothing is unpickled.
    """
    args, results, error = _decode(app, row)
    return Job.from_claim(row, args, results), error


def _decode(app: App, row: dict[str, Any]) -> tuple[Any, Any, str | None]:
    """The args and upstream results of a claimed row, decoded, and why they are unusable
    (None: they are usable)."""
    loads = app.json_loads
    if loads is json.loads:
        loads = fast_loads  # the same values and errors, without json.loads's Python layer
    try:
        args = loads(row["args"])
    except Exception as exc:
        return None, None, f"cannot decode the job's args: {exc}"
    if not isinstance(args, dict):
        return args, None, f"the job's args must decode to an object, got {type(args).__name__}"
    results = row.get("upstream_results")
    if results is None:
        return args, None, None
    # A workflow job released with its upstreams' results (see akadze_core.enqueue.workflow).
    try:
        value = loads(results)
    except Exception as exc:
        return args, None, f"cannot decode the job's upstream results: {exc}"
    result_arg = row.get("result_arg")
    if result_arg:
        args[result_arg] = value
    return args, value, None


def prepare(
    app: App, row: dict[str, Any], worker_id: int | None
) -> tuple[outcomes.Outcome | None, Any, JobContext | None, Any]:
    """The task, context and args to run ``row`` with, or the outcome when it cannot run.

    The context's ``Job`` is built only if the body (or the facade) asks for it: a frozen
    dataclass of 27 fields was the biggest part of a no-op's run."""
    args, results, decode_error = _decode(app, row)
    task = app.tasks.get(row["task"])
    if task is None:
        error = Fail(f"unknown task {row['task']!r}: it is not registered in this worker")
        entry = outcomes.error_entry(error, "NotRegistered", app.redact)
        return outcomes.Outcome(row["id"], row["run_count"], outcomes.FAIL, error=entry,
                                claim_token=row.get("claim_token")), None, None, None
    if decode_error is not None:
        return outcomes.Outcome(
            row["id"], row["run_count"], outcomes.FAIL,
            error=outcomes.error_entry(Fail(decode_error), "ArgsDecodeError", app.redact),
            claim_token=row.get("claim_token")), None, None, None
    last_error = row.get("last_error")
    context = JobContext.claimed(app, row, args, results, worker_id,
                                 fast_loads(last_error) if isinstance(last_error, str) else None)
    return None, task, context, args


def raised_outcome(context: JobContext, task: Any, row: dict[str, Any],
                   exc: BaseException) -> outcomes.Outcome | None:
    """The outcome of a body of ``row`` that raised ``exc`` (None: complete_tx wrote it)."""
    if context.completed:
        logger.warning("job %s raised after complete_tx committed it: %r", row["id"], exc)
        return None
    return outcomes.raised(row["id"], row["run_count"], row["attempt"], exc, task.backoff,
                           context.app.redact, claim_token=row.get("claim_token"))


def returned_outcome(app: App, context: JobContext, task: Any, row: dict[str, Any],
                     value: Any) -> outcomes.Outcome | None:
    """The outcome of a body of ``row`` that returned ``value`` (None: complete_tx wrote it)."""
    if context.completed:
        return None
    return outcomes.succeeded(row["id"], row["run_count"], row["attempt"], value, task.backoff,
                              app.json_dumps, app.max_result_bytes,
                              claim_token=row.get("claim_token"))


_loop: asyncio.AbstractEventLoop | None = None


def _child_loop() -> asyncio.AbstractEventLoop:
    """The one event loop of this process's async bodies (a pool child runs one at a time).

    Not a loop per body (``asyncio.run``): the App opens one async pool per loop, so every
    body left a pool and its connection open behind it, and a child's connections grew with
    the bodies it ran. One loop keeps one pool, as the bodies of a worker process share its
    loop (and, as there, what a body leaves running on the loop goes on)."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


def execute_here(app: App, row: dict[str, Any], worker_id: int | None) -> outcomes.Outcome | None:
    """Run the job of ``row`` in this thread, to the end (a process pool's child does this;
    its parent enforces the timeout by ending the process)."""
    early, task, context, args = prepare(app, row, worker_id)
    if context is None:
        return early
    token = set_current(context)
    try:
        if task.is_async:
            value = _child_loop().run_until_complete(task.func(**args))
        else:
            value = task.func(**args)
    except BaseException as exc:  # a task's SystemExit must not take the process down
        return raised_outcome(context, task, row, exc)
    finally:
        reset_current(token)
    return returned_outcome(app, context, task, row, value)


def call_body(task: Any, args: dict[str, Any], threads: ThreadRunner) -> Awaitable[Any]:
    """What to await for the body of ``task`` called with ``args``: an async body's own
    coroutine, a sync body's thread (``threads``), either within the task's timeout."""
    # The body's awaitable itself when there is no timeout: no coroutine frame of its own
    # between the run and the body.
    if task.is_async:
        call = task.func(**args)
    else:
        # Threads do not inherit context variables: carry current() over explicitly.
        context = contextvars.copy_context()
        call = threads.submit(context.run, task.func, **args)
    if task.timeout is None:
        return call
    return _within(call, task.timeout)


async def _within(call: Awaitable[Any], timeout: float) -> Any:
    try:
        return await asyncio.wait_for(call, timeout)
    except asyncio.TimeoutError:
        # A sync body's thread cannot be killed: it runs on, and its result is discarded.
        raise JobTimeout(f"the task ran longer than its timeout of {timeout:g}s") from None
