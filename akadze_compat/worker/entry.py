"""The function akadze_core runs for every Celery task, and how its outcome maps to a job's.

Each Celery task is registered on the core app under its own name with an entry taking the
job's args ``{"args": [...], "kwargs": {...}}``. The entry rebuilds ``self.request`` from the
job, runs the call through the tracer, and reports the outcome the core's way:

=================================  ==========================================================
Celery outcome                     akadze_core outcome
=================================  ==========================================================
returned a value                   the value is the job's result (None with ignore_result)
``Retry`` (``self.retry``,         ``akadze_core.Retry(countdown, max_attempts=M + 1)``
``autoretry_for``)                 raised from the cause, so the job's error entry describes
                                   the real exception; ``M`` is the retry's max_retries
                                   (the call's, else the task's; None: forever)
any other exception                ``akadze_core.Fail`` raised from it: FAILURE at once
                                   (Celery never retries on its own)
``Ignore``                         ``Cancel``: no result, nothing waiting on it runs, and
                                   the Celery state stays as it was (PENDING or the
                                   body's ``update_state``)
``Reject(requeue=False)``          ``Fail``
``Reject(requeue=True)``           ``akadze_core.Snooze(0)``: back to the queue, no attempt
hard ``time_limit``                ``TimeLimitExceeded`` raised in the body: FAILURE
=================================  ==========================================================
"""

from __future__ import annotations

import inspect
import logging
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from akadze_core import Cancel, Fail, Snooze, current
from akadze_core import Retry as CoreRetry
from akadze_core.integration import (
    Outcome,
    decide_retry,
    outcome_of,
    store_outcome,
    store_outcome_sync,
)

from .. import signals, states
from ..app import trace as trace_module
from ..app.context import Context
from ..app.flow import ERRBACK, PASS
from ..app.publish import FOREVER, task_limits
from ..app.trace import (
    ExceptionInfo,
    RetryCall,
    TraceResult,
    WorkerRun,
    call_body,
    trace_async,
    worker_run,
)
from ..backends.base import celery_meta
from ..exceptions import (
    MaxRetriesExceededError,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    WorkerLostError,
)
from ..result import stored_value
from ..serialization import revive
from .canvas import errback_call, is_new_style_errback, step_args
from .request import send_received
from .timelimits import AsyncLimits, async_limits, limits_for, sync_limits

if TYPE_CHECKING:
    from akadze_core import Job, JobContext

    from ..app.base import Celery
    from ..app.task import Task

__all__ = ["core_timeout", "is_async_task", "make_entry"]

logger = logging.getLogger("akadze_compat.entry")

#: The worker's name in ``request.hostname`` (the CLI sets it from ``-n``).
worker_hostname = f"celery@{socket.gethostname()}"
#: The core's timeout is the hard limit plus this much (at least): a backstop for bodies
#: that do not stop when ``TimeLimitExceeded`` is raised in them.
HARD_LIMIT_GRACE = 2.0


def is_async_task(task: Task) -> bool:
    """Whether the task's body is an ``async def``."""
    body = getattr(task, "_orig_run", None) or task.run
    return inspect.iscoroutinefunction(body)


def core_timeout(task: Task) -> float | None:
    """The core timeout for a task: its hard time limit plus a grace period, or None."""
    hard = task.option("time_limit", "task_time_limit")
    if not hard:
        return None
    return float(hard) + max(HARD_LIMIT_GRACE, 0.05 * float(hard))


def make_entry(app: Celery, name: str) -> Any:
    """The function to register on the core app for the Celery task ``name``."""
    if is_async_task(app.registry[name]):
        async def run_async_celery_task(args: Any = None, kwargs: Any = None,
                                        **unexpected: Any) -> Any:
            return await _run_async(app, name, args, kwargs, unexpected)

        return run_async_celery_task

    def run_celery_task(args: Any = None, kwargs: Any = None, **unexpected: Any) -> Any:
        return _run_sync(app, name, args, kwargs, unexpected)

    return run_celery_task


@dataclass(slots=True)
class _Run:
    task: Task
    context: JobContext
    request: Context
    args: list[Any]
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    limits: dict[float, type[BaseException]]
    #: a new-style errback job, to call ``(request, exc, traceback)`` (decided on its row's
    #: own args, before ``step_args``)
    new_style_errback: bool = False


class JobFields(Protocol):
    """What a request is built from: a ``Job``, or the running ``JobContext`` (which reads
    them off the claimed row, so a run builds no ``Job`` unless something else asks)."""

    @property
    def id(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def run_count(self) -> int: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def position(self) -> int | None: ...
    @property
    def meta(self) -> dict[str, Any]: ...


def build_request(task: Task, job: JobFields, meta: dict[str, Any], args: list[Any],
                  kwargs: dict[str, Any]) -> Context:
    """``self.request`` for a run of ``job``."""
    task_id = task.app.core.task_ids().of(job.id, job.meta)
    custom_headers = dict(meta.get("headers") or {})
    hard, soft = meta.get("time_limit"), meta.get("soft_time_limit")
    ignore_result = meta.get("ignore_result")
    if ignore_result is None:
        ignore_result = bool(task.option("ignore_result", "task_ignore_result"))
    # One dict literal handed to the request as its attributes: what Context(custom_headers,
    # **fields) builds (the fields win over a custom header of the same name, and
    # ``timelimit`` fills ``time_limit``/``soft_time_limit``), in a fraction of the time.
    fields = {
        "id": task_id, "task": job.task, "args": args, "kwargs": kwargs,
        "retries": max(0, job.attempt - 1), "is_eager": False, "called_directly": False,
        "hostname": worker_hostname, "eta": meta.get("eta"),
        "expires": meta.get("expires") or (job.expires_at.isoformat() if job.expires_at
                                           else None),
        "delivery_info": {"exchange": meta.get("exchange") or "",
                          "routing_key": meta.get("routing_key") or job.queue,
                          "queue": job.queue, "priority": job.priority,
                          "redelivered": job.run_count > job.attempt},
        # Celery's request.headers: the custom headers, or the custom header named
        # "headers" when there is one (where tracers nest their context).
        "headers": custom_headers.get("headers", custom_headers or None),
        "root_id": meta.get("root_id") or task_id,
        "parent_id": meta.get("parent_id"), "correlation_id": task_id, "reply_to": "",
        "ignore_result": ignore_result, "shadow": meta.get("shadow"),
        "callbacks": meta.get("link"), "errbacks": meta.get("link_error"), "utc": True,
        "timelimit": (hard, soft) if hard is not None or soft is not None else None,
        "origin": None, "_akadze_meta": meta, "time_limit": hard, "soft_time_limit": soft,
    }
    if "group_id" in meta:  # a group's member (a canvas node): Celery's request.group
        # Its index is in its meta, or (members sent in bulk) its job's position.
        index = meta.get("group_index")
        fields["group"] = meta["group_id"]
        fields["group_index"] = job.position if index is None else index
    return Context.from_attributes({**custom_headers, **fields} if custom_headers else fields)


def _revived_meta(job: JobFields) -> dict[str, Any]:
    """``dict(revive(celery_meta(job)))``: a new dict, without a call per scalar.

    Most of the meta is None, strings and booleans, which ``revive`` returns as they are,
    and an empty container (the usual ``headers``) revives to a new empty one of its kind.
    """
    source = celery_meta(job)
    if len(source) == 2 and "__type__" in source and "__value__" in source:
        return dict(revive(source))  # the whole meta is one typed value: as revive sees it
    meta = dict(source)
    for key, value in source.items():
        if value is not None and isinstance(value, (dict, list)):
            meta[key] = revive(value) if value else ({} if isinstance(value, dict) else [])
    return meta


def _prepare(app: Celery, name: str, args: Any, kwargs: Any, unexpected: dict[str, Any]) \
        -> _Run:
    if unexpected:
        raise Fail(f"job args for the Celery task {name!r} must be {{'args': [...], "
                   f"'kwargs': {{...}}}}, got the keys {sorted(unexpected)}")
    task = app.registry[name]
    context = current()
    meta = _revived_meta(context)
    # decided on the row's own args (an errback signature's), not on a retry's
    new_style = is_new_style_errback(task, meta, list(args or []), dict(kwargs or {}))
    override = meta.get("retry_args")
    if isinstance(override, dict):
        args, kwargs = override.get("args"), override.get("kwargs")
    args, kwargs = list(args or []), dict(kwargs or {})
    if not isinstance(override, dict) and (meta.get(ERRBACK) is not None or meta.get(PASS)):
        # a canvas step (errback, or passed its upstreams' results): the only runs that
        # need the whole Job (step_args returns the args as they are for any other)
        args = step_args(task, context.job, meta, args, kwargs)
    request = build_request(task, context, meta, args, kwargs)
    task_hard, task_soft = task_limits(task)
    hard = meta.get("time_limit") or task_hard
    soft = meta.get("soft_time_limit") or task_soft
    limits = limits_for(soft, hard, SoftTimeLimitExceeded, TimeLimitExceeded)
    return _Run(task, context, request, args, kwargs, meta, limits, new_style)


def _new_style_errback(app: Celery, run: _Run) -> Any:
    """Call a new-style errback as Celery does, ``errback(request, exc, traceback)`` (a
    plain call, not a traced task run): ``request`` rebuilt from the failed job's row,
    ``exc`` from its last error entry (never unpickled). Its return value is dropped."""
    failed = app.core.get_job(run.context.job.upstreams[0]) if run.context.job.upstreams \
        else None
    call = errback_call(app, run.context.job, failed)
    if failed is not None:
        failed_task = app.registry.get(failed.task) or run.task
        failed_meta = _revived_meta(failed)
        failed_args = revive(failed.args.get("args")) if isinstance(failed.args, dict) else []
        failed_kwargs = revive(failed.args.get("kwargs")) if isinstance(failed.args, dict) \
            else {}
        failed_args = list(failed_args or ())
        if failed.started_at is not None:  # it ran: with its upstreams' results first
            failed_args = step_args(failed_task, failed, failed_meta, failed_args,
                                    dict(failed_kwargs or {}))
        request = build_request(failed_task, failed, failed_meta, failed_args,
                                dict(failed_kwargs or {}))
        request.errbacks = failed_meta.get("link_error")
    else:
        request = run.request
    if run.meta.get(ERRBACK, {}).get("immutable"):
        called = run.task(*run.args, **run.kwargs)
    else:
        called = run.task(request, call.exception, call.traceback, *run.args, **run.kwargs)
    if inspect.isawaitable(called):
        async def drop() -> None:
            await called
        return drop()
    return None


def _stale_state_patch(run: _Run) -> dict[str, Any] | None:
    """A custom state left by an earlier attempt is cleared before this one starts."""
    if "state" not in run.meta:
        return None
    run.meta.pop("state", None)
    run.meta.pop("result", None)
    return {"celery": run.meta}


def _history_matters(run: _Run) -> bool:
    """Whether the previous attempt may have ended outside the facade in a way Celery treats
    differently from the core: on the core's timeout (the backstop of the hard limit), or by
    a lost worker under an unbounded attempt budget (the job was sent by a process that does
    not know the task, so the core does not bound its reruns)."""
    context = run.context
    if context.attempt <= 1:
        return False
    return TimeLimitExceeded in run.limits.values() or context.max_attempts >= FOREVER


def _needs_lost_count(run: _Run) -> bool:
    """Whether ``_ended_outside`` needs the number of lost runs, which takes reading the
    job's whole history (one query): only on the run right after a lost worker."""
    return (_history_matters(run) and run.task.max_retries is not None
            and (run.context.last_error or {}).get("type") == "WorkerLost")


def _ended_outside(run: _Run, lost: int) -> BaseException | None:
    """The Celery exception that ends this job now, judged from its earlier attempts: the
    previous attempt hit the core's timeout (``TimeLimitExceeded``, as Celery's hard limit),
    or workers were lost (``lost`` runs) more often than ``max_retries`` allows
    (``WorkerLostError``).

    The claim hands over the newest error entry (``current().last_error``): all the timeout
    check needs, so first attempts and ordinary retries cost no query.
    """
    last = run.context.last_error
    if not _history_matters(run) or last is None:
        return None
    if last.get("type") == "JobTimeout" and last.get("attempt") in (None,
                                                                    run.context.attempt - 1):
        hard = run.request.time_limit or run.task.option("time_limit", "task_time_limit")
        return TimeLimitExceeded(hard)
    limit = run.task.max_retries
    if last.get("type") == "WorkerLost" and limit is not None and lost > limit:
        return WorkerLostError(f"Worker exited prematurely {lost} times while running the "
                               f"task (max_retries is {limit})")
    return None


def _check_deadline(run: _Run) -> None:
    """End the run unstarted (REVOKED) if it is past an ``expires`` deadline kept only in
    its meta: a periodic task's ``options={"expires": datetime}`` holds for every run, so
    it cannot be the job's ``expires_at``, which the claim would have checked."""
    text = run.meta.get("expires")
    if run.context.expires_at is not None or not text:
        return
    try:
        deadline = text if isinstance(text, datetime) else datetime.fromisoformat(str(text))
    except ValueError:
        return
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    if deadline <= datetime.now(timezone.utc):
        raise Cancel(f"expired at {deadline.isoformat()}")


def _lost_runs(job: Job | None) -> int:
    """How many runs of ``job`` were lost with their worker."""
    return sum(1 for entry in (job.errors if job else ()) if entry.get("type") == "WorkerLost")


def _fail_now(run: _Run, exc: BaseException) -> None:
    """Fail the job before running the body, with Celery's failure hooks (as Celery does
    for a hard time limit)."""
    try:
        raise exc
    except BaseException:
        einfo = ExceptionInfo(exc)
    task, request = run.task, run.request
    task_id = str(request.id)
    task.on_failure(exc, task_id, run.args, run.kwargs, einfo)
    task.after_return(states.FAILURE, exc, task_id, run.args, run.kwargs, None)
    signals.task_failure.send(sender=task, task_id=request.id, exception=exc, args=run.args,
                              kwargs=run.kwargs, traceback=exc.__traceback__, einfo=einfo)
    raise Fail(f"{type(exc).__name__}: {exc}") from exc


def _revoked(job: Job | None) -> bool | None:
    """None unless a revoke was requested (True: it expired, False: revoked)."""
    if job is None:
        return None
    if job.expires_at is not None and job.expires_at <= datetime.now(timezone.utc):
        return True
    return False if job.cancel_requested else None


def _revoked_locally(run: _Run) -> bool | None:
    """``_revoked`` from the row the claim returned, without a query.

    The claim says whether the job was revoked when it was claimed (normally not: such a
    claim cancels the job instead of running it) and when it expires, so an expiry is
    known here. A revoke made while the body ran is not: the callers then read the job
    once. ``trace`` asks only after an exception (where the outcome depends on it: REVOKED
    and ``task_revoked`` instead of the failure or retry handlers), so runs that return
    never pay for that query.
    """
    return _revoked(run.context.job)


def _retry_countdown(run: _Run, when: Any) -> float:
    if when is None:
        return float(run.task.retry_delay() or 0)
    if isinstance(when, datetime):
        moment = when if when.tzinfo else when.replace(tzinfo=run.task.app.timezone)
        return max(0.0, (moment - datetime.now(timezone.utc)).total_seconds())
    return max(0.0, float(when))


def _retry_patch(run: _Run, result: TraceResult) -> dict[str, Any] | None:
    """New arguments asked for by ``retry(args=..., kwargs=...)``, and the custom headers
    the publish signals' receivers left in the retry's message, kept in the job's meta."""
    if result.state != states.RETRY:
        return None
    sig = getattr(result.exception, "sig", None)
    if not isinstance(sig, RetryCall) or (sig.args is None and sig.headers is None):
        return None
    if sig.args is not None:
        run.meta["retry_args"] = {"args": list(sig.args), "kwargs": dict(sig.kwargs or {})}
    if sig.headers is not None:
        run.meta["headers"] = sig.headers or None
    return {"celery": run.meta}


def _ignore_patch(run: _Run, result: TraceResult) -> dict[str, Any] | None:
    """``raise Ignore()``: the job ends (cancelled, without a result) marked ignored, so its
    Celery state stays what it was, PENDING or the custom state the body set with
    ``update_state`` (Celery stores nothing for an ignored task)."""
    if result.state != states.IGNORED:
        return None
    run.meta["ignored"] = True
    return {"celery": run.meta}


def _meta_patch(run: _Run, result: TraceResult) -> dict[str, Any] | None:
    """What the run's outcome needs kept in the job's meta before it is written."""
    if result.state == states.SUCCESS:  # the usual outcome needs nothing kept
        return None
    return _retry_patch(run, result) or _ignore_patch(run, result)


def _retry_budget(exc: BaseException) -> int | None:
    """The attempt budget a ``self.retry()`` call needs: Celery's limit ``max_retries=M``
    (the call's, else the task's) is ``M + 1`` core attempts, None is forever.

    The job was sent with the task's ``max_retries``; ``retry(max_retries=M)`` (or
    ``retry_kwargs={"max_retries": M}``) may allow more, and ``self.retry`` already refused
    a retry past ``M``, so the core raises the budget (never lowers it) and retries. None
    for a ``Retry`` raised by hand: the job's budget stands.
    """
    sig = getattr(exc, "sig", None)
    if not isinstance(sig, RetryCall):
        return None
    return FOREVER if sig.max_retries is None else min(FOREVER, int(sig.max_retries) + 1)


def _outcome(run: _Run, result: TraceResult) -> Any:
    """Return the job's result, or raise what tells the core how the run ended."""
    if result.state == states.SUCCESS:
        return None if run.request.ignore_result else stored_value(result.retval)
    exc = result.exception
    assert exc is not None
    if result.state == states.IGNORED:
        # Cancelled, not succeeded: what waits on it (a chain's next step, a chord's body,
        # link callbacks) never runs, as Celery applies no callbacks after Ignore; the
        # state stays what it was (the meta's "ignored" mark, see _ignore_patch).
        raise Cancel("ignored: the task raised Ignore()") from exc
    if result.state == states.REJECTED:
        if getattr(exc, "requeue", False):
            raise Snooze(0) from exc
        raise Fail(f"rejected: {getattr(exc, 'reason', None)!r}") from exc
    if result.state == states.RETRY:
        retry = CoreRetry(_retry_countdown(run, getattr(exc, "when", None)),
                          max_attempts=_retry_budget(exc))
        context = run.context
        if decide_retry(retry, context.attempt, context.max_attempts).exhausted:
            # A Retry raised by hand (not through self.retry, which checks max_retries
            # itself) with no attempt left: fail as self.retry would have.
            error = MaxRetriesExceededError(
                f"Can't retry {run.task.name}[{run.request.id}] args:{run.args} "
                f"kwargs:{run.kwargs}", task_args=run.args, task_kwargs=run.kwargs)
            raise Fail(str(error)) from error
        cause = getattr(exc, "exc", None)
        raise retry from (cause if isinstance(cause, BaseException) else exc)
    raise Fail(f"{type(exc).__name__}: {exc}") from exc


def _core_outcome(run: _Run, result: TraceResult) -> Outcome:
    """The outcome the core's worker would write for ``result`` (what ``_outcome`` returns
    or raises, classified by the core as its executor does)."""
    try:
        value = _outcome(run, result)
    except BaseException as exc:
        return outcome_of(run.context, exc=exc)
    return outcome_of(run.context, value=value)


def _stored(run: _Run, written: bool) -> None:
    # Written (or fenced out: this run no longer owns the job, and the worker's own write
    # would change nothing either): the worker must not write it again.
    run.context.completed = True
    if not written:
        logger.warning("task %s[%s]: its outcome was not stored (the run no longer owns "
                       "the job)", run.task.name, run.request.id)


def _store_sync(run: _Run, result: TraceResult) -> None:
    """Write the run's outcome now, before ``task_postrun`` (only sent to receivers).

    The core's worker batches outcomes after the body returns, so a receiver reading the
    task's state would see PENDING; only runs with receivers pay for this write of their
    own, through the core's outcome store (the completer's fenced write). If it fails, the
    worker's completer writes the outcome as usual (and retries)."""
    patch = _meta_patch(run, result)
    outcome = _core_outcome(run, result)
    try:
        if patch is not None:
            run.context.update_meta_sync(patch)
        written = store_outcome_sync(run.context.app, outcome)
    except Exception as exc:
        _not_stored(run, exc)
        return
    _stored(run, written)


def _not_stored(run: _Run, exc: Exception) -> None:
    logger.warning("task %s[%s]: storing the outcome before task_postrun failed (%s); "
                   "the worker writes it after", run.task.name, run.request.id,
                   type(exc).__name__)


async def _store_async(run: _Run, result: TraceResult) -> None:
    """``_store_sync`` for an ``async def`` body."""
    patch = _meta_patch(run, result)
    outcome = _core_outcome(run, result)
    try:
        if patch is not None:
            await run.context.update_meta(patch)
        written = await store_outcome(run.context.app, outcome)
    except Exception as exc:
        _not_stored(run, exc)
        return
    _stored(run, written)


#: Where a task keeps its tracer: ``(build_tracer it came from, tracer)``.
_TRACER = "_akadze_tracer"


def _tracer(task: Task) -> Any:
    """The tracer the worker runs ``task`` through: built by ``build_tracer`` as it is on
    ``akadze_compat.app.trace`` now (Celery's ``celery.app.trace``), once per task and
    process, and again after that function was replaced."""
    builder = trace_module.build_tracer
    kept = task.__dict__.get(_TRACER)
    if kept is not None and kept[0] is builder:
        return kept[1]
    app = task.app
    tracer = builder(str(task.name), task, getattr(app, "loader", None), worker_hostname,
                     app=app)
    task.__dict__[_TRACER] = (builder, tracer)
    return tracer


def _run_sync(app: Celery, name: str, args: Any, kwargs: Any, unexpected: dict[str, Any]) \
        -> Any:
    run = _prepare(app, name, args, kwargs, unexpected)
    if run.new_style_errback:
        return _new_style_errback(app, run)
    context = run.context
    patch = _stale_state_patch(run)
    if patch is not None:
        context.update_meta_sync(patch)
    if _history_matters(run):  # else nothing earlier to judge (a first attempt, say)
        lost = _lost_runs(app.core.get_job(context.id)) if _needs_lost_count(run) else 0
        ended = _ended_outside(run, lost)
        if ended is not None:
            _fail_now(run, ended)
    _check_deadline(run)
    send_received(run.task, run.request)

    def body(task: Any, args: Any, kwargs: Any) -> Any:
        limits = sync_limits(run.limits)
        if limits is None:  # no timers to arm: skip the context manager
            return call_body(task, args, kwargs)
        with limits:
            return call_body(task, args, kwargs)

    def revoked() -> bool | None:
        local = _revoked_locally(run)
        return local if local is not None else _revoked(app.core.get_job(context.id))

    traced = WorkerRun(run.request, body, revoked, lambda outcome: _store_sync(run, outcome))
    token = worker_run.set(traced)
    try:
        _tracer(run.task)(run.request.id, run.args, run.kwargs, run.request.__dict__)
    finally:
        worker_run.reset(token)
    result = traced.result
    if result is None:  # a wrapper around the tracer returned without calling it
        raise Fail(f"the tracer of {name!r} did not run the task")
    if context.completed:
        return None
    patch = _meta_patch(run, result)
    if patch is not None:
        context.update_meta_sync(patch)
    return _outcome(run, result)


async def _run_async(app: Celery, name: str, args: Any, kwargs: Any,
                     unexpected: dict[str, Any]) -> Any:
    run = _prepare(app, name, args, kwargs, unexpected)
    if run.new_style_errback:
        called = _new_style_errback(app, run)
        return await called if inspect.isawaitable(called) else called
    context = run.context
    patch = _stale_state_patch(run)
    if patch is not None:
        await context.update_meta(patch)
    if _history_matters(run):  # else nothing earlier to judge (a first attempt, say)
        lost = _lost_runs(await app.core.get_job_async(context.id)) \
            if _needs_lost_count(run) else 0
        ended = _ended_outside(run, lost)
        if ended is not None:
            _fail_now(run, ended)
    _check_deadline(run)
    send_received(run.task, run.request)

    async def body() -> Any:
        called = call_body(run.task, run.args, run.kwargs)
        if not inspect.isawaitable(called):
            return called
        return await AsyncLimits(async_limits(run.limits)).run(called)

    async def revoked() -> bool | None:
        local = _revoked_locally(run)
        return local if local is not None else _revoked(await app.core.get_job_async(context.id))

    result = await trace_async(run.task, run.request, run.args, run.kwargs, body,
                               revoked=revoked, store=lambda traced: _store_async(run, traced))
    if context.completed:
        return None
    patch = _meta_patch(run, result)
    if patch is not None:
        await context.update_meta(patch)
    return _outcome(run, result)
