"""``-P prefork``: Celery's prefork pool on akadze_core's process pool.

The worker process claims jobs for every process in one statement and writes outcomes in
batches; its children (fresh interpreters re-running the same command, never forks) only
run task bodies, one at a time each, as Celery's pool processes do. What Celery users
rely on carries over: ``-c`` children, ``--max-tasks-per-child``, a child killed from
outside is replaced (a task it was running ends with ``ProcessLost`` and is retried),
children exit when the worker goes. See ``akadze_core.execution.processes`` for the mechanics.

Time limits and terminate, as Celery's prefork pool has them (``CeleryProcessPool``):

- soft limit (``soft_time_limit``, ``apply_async(soft_time_limit=...)``,
  ``task_soft_time_limit``): the child gets SIGUSR1 and its handler raises
  ``SoftTimeLimitExceeded`` in the body, interrupting a blocking call
  (``akadze_compat.worker.timelimits``);
- hard limit (``time_limit``, per call, ``task_time_limit``): the child is killed and
  replaced, and the task fails at once with ``TimeLimitExceeded``, no retry: its
  ``on_failure``, ``after_return`` and the ``task_failure`` signal run in the worker
  process, as Celery 5.7's ``Request.on_timeout`` does;
- ``revoke(task_id, terminate=True, signal=...)``: the child running it gets the signal. If
  it dies of it, the task ends REVOKED without spending an attempt, ``task_revoked`` is sent
  in the worker process with ``terminated=True`` and ``signum``, and the child is replaced.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from akadze_core import JobTimeout
from akadze_core.integration import (
    CHILD_ENV,
    FAIL,
    Outcome,
    ProcessPool,
    Terminated,
    child_number,
    decode_job,
    error_entry,
    is_child,
)

from .. import signals, states
from ..app.trace import ExceptionInfo
from ..backends.base import celery_meta
from ..exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from ..serialization import revive
from ..utils.objects import is_default
from .entry import build_request, is_async_task
from .timelimits import install_child_handler

if TYPE_CHECKING:
    from akadze_core import App as CoreApp

    from ..app.base import Celery
    from ..app.context import Context
    from ..app.task import Task

__all__ = ["CHILD_ENV", "CeleryProcessPool", "ChildInfo", "child_info", "install_child_limits"]

logger = logging.getLogger("akadze_compat.worker")


@dataclass(frozen=True)
class ChildInfo:
    """A pool child's place in its pool (Celery names it ``ForkPoolWorker-<number>``)."""

    number: int


def child_info() -> ChildInfo | None:
    """This process's place in a prefork pool, or None when it is not a pool child."""
    return ChildInfo(child_number()) if is_child() else None


def install_child_limits() -> None:
    """In a pool child, before it serves: SIGUSR1 raises ``SoftTimeLimitExceeded`` in the
    body it runs (the parent sends it at the soft limit)."""
    install_child_handler(SoftTimeLimitExceeded, CeleryProcessPool.soft_signal)


def _row_meta(row: Mapping[str, Any]) -> dict[str, Any]:
    """A claimed row's meta (its JSON text, as the claim returns it)."""
    meta = row.get("meta")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return {}
    return meta if isinstance(meta, dict) else {}


def _meta_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The Celery part of a claimed row's meta."""
    celery = _row_meta(row).get("celery")
    return celery if isinstance(celery, dict) else {}


def _seconds(value: Any) -> float | None:
    if value is None:  # no limit, the usual case: not a caught TypeError per job
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


_LIMITS = "akadze_compat.worker.pool.limits"


def _setting_limits(conf: Any, previous: Any) -> tuple[Any, Any]:
    """The ``task_time_limit`` and ``task_soft_time_limit`` settings (``conf.derived``)."""
    return conf.get("task_time_limit"), conf.get("task_soft_time_limit")


class CeleryProcessPool(ProcessPool):
    """The process pool of ``akadze-compat worker -P prefork``: a task's Celery time limits
    and the outcome of a run that ended with its process, decided as Celery does."""

    def __init__(self, app: Celery, processes: int, argv: Sequence[str], **kwargs: Any) -> None:
        super().__init__(processes, argv, **kwargs)
        self.app = app

    def limits(self, app: CoreApp, row: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """(soft, hard): the call's ``soft_time_limit``/``time_limit``, else the task's, else
        the ``task_soft_time_limit``/``task_time_limit`` settings. An ``async def`` body gets
        its soft limit at an ``await`` in the child instead of a signal (a signal would land
        in the child's event loop, not in the body)."""
        task = self.app.registry.get(row["task"])
        if task is None:
            return super().limits(app, row)
        # Per job, in the worker process: the meta's JSON is parsed only when it can hold
        # a limit ("soft_time_limit" contains "time_limit"); most calls set none.
        text = row.get("meta")
        meta = _meta_of(row) if not isinstance(text, str) or "time_limit" in text else {}
        # The settings' limits are read once per change of the settings (as Celery's pool
        # reads them once, at its start): looking both up per job was a twentieth of the
        # parent's time in a drain of no-ops.
        hard_setting, soft_setting = self.app.conf.derived(_LIMITS, _setting_limits)
        hard = task.time_limit
        soft = task.soft_time_limit
        hard = _seconds(meta.get("time_limit") or (hard_setting if hard is None else hard))
        soft = _seconds(meta.get("soft_time_limit") or (soft_setting if soft is None else soft))
        if soft is not None and is_async_task(task):
            soft = None
        return soft, hard

    def soft_limit_reached(self, row: Mapping[str, Any], soft: float | None) -> None:
        """Celery's warning, as its worker logs it when the soft limit passes."""
        logger.warning("Soft time limit (%ss) exceeded for %s[%s]", soft, row["task"],
                       _row_meta(row).get("task_id")
                       or self.app.core.task_ids().derive(int(row["id"])))

    def lost_outcome(self, app: CoreApp, row: Mapping[str, Any], exc: Exception) -> Outcome:
        """Past the hard limit: FAILURE with ``TimeLimitExceeded`` at once, its failure
        hooks run here. Terminated by a revoke: REVOKED (the core's cancel), ``task_revoked``
        sent here with ``terminated=True``. A lost process: the core's outcome (retried)."""
        if isinstance(exc, JobTimeout):
            _, hard = self.limits(app, row)
            limit = TimeLimitExceeded(hard)
            call = self._call(app, row)
            if call is not None:
                task, request, args, kwargs = call
                logger.error("Hard time limit (%ss) exceeded for %s[%s]", hard, task.name,
                             request.id)
                _failure_hooks(task, request, args, kwargs, limit)
            return Outcome(row["id"], row["run_count"], FAIL,
                           error=error_entry(limit, redact=app.redact),
                           claim_token=row.get("claim_token"))
        if isinstance(exc, Terminated):
            call = self._call(app, row)
            if call is not None:
                task, request, _, _ = call
                logger.info("Task %s[%s] terminated (signal %s)", task.name, request.id,
                            exc.signum)
                _safely("task_revoked", lambda: signals.task_revoked.send(
                    sender=task, request=request, terminated=True, signum=exc.signum,
                    expired=False))
        return super().lost_outcome(app, row, exc)

    def _call(self, app: CoreApp, row: Mapping[str, Any]) \
            -> tuple[Task, Context, list[Any], dict[str, Any]] | None:
        """The task, request, args and kwargs of the run of ``row`` (None: not a Celery
        task's, or its args cannot be read), rebuilt here as the child built them."""
        task = self.app.registry.get(row["task"])
        if task is None:
            return None
        try:
            job, error = decode_job(app, dict(row))
            if error is not None or not isinstance(job.args, dict):
                return None
            meta = dict(revive(celery_meta(job)))
            args = list(revive(job.args.get("args")) or [])
            kwargs = dict(revive(job.args.get("kwargs")) or {})
            return task, build_request(task, job, meta, args, kwargs), args, kwargs
        except Exception:  # a row the child could not have run either: no hooks
            logger.exception("job %s: cannot rebuild its request", row.get("id"))
            return None


def _safely(what: str, call: Any) -> None:
    try:
        call()
    except Exception:
        logger.exception("%s handler raised", what)


def _failure_hooks(task: Task, request: Context, args: list[Any], kwargs: dict[str, Any],
                   exc: BaseException) -> None:
    """What Celery runs for a hard time limit: ``on_failure``, ``after_return`` (if the task
    has its own) and ``task_failure``; a hook that raises is logged, not passed on."""
    try:
        raise exc
    except BaseException:
        einfo = ExceptionInfo(exc)
    task_id = str(request.id)
    # As Celery's Request.on_timeout: called in the worker process, with no request pushed.
    _safely("on_failure", lambda: task.on_failure(exc, task_id, args, kwargs, einfo))
    after_return = task.after_return
    if not is_default(getattr(after_return, "__func__", None)):  # Celery: task_has_custom
        _safely("after_return", lambda: after_return(states.FAILURE, exc, task_id, args,
                                                     kwargs, None))
    _safely("task_failure", lambda: signals.task_failure.send(
        sender=task, task_id=request.id, exception=exc, args=args, kwargs=kwargs,
        traceback=exc.__traceback__, einfo=einfo))
