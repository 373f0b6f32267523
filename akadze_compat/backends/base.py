"""The result "backend": a task's Celery state, result and exception, read from its job.

There is no separate result store: the state is derived from the job's columns (see
``job_state``), the return value is the job's result, and a failure's exception is rebuilt
from the job's last error entry by type and module only: never unpickled, and its module
never imported (only one already imported is looked in).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from akadze_core import current

from .. import _state, exceptions, states
from .._state import get_current_task
from ..exceptions import ChordError, TaskRevokedError
from ..serialization import revive
from ..utils.serialization import UnpickleableExceptionWrapper
from .classes import (
    Backend,
    BaseBackend,
    BaseDictBackend,
    BaseKeyValueStoreBackend,
    DisabledBackend,
    KeyValueStoreBackend,
    SyncBackendMixin,
)

if TYPE_CHECKING:
    from akadze_core import App as CoreApp
    from akadze_core import Job

    from ..app.task import Task

__all__ = [
    "FINISHED",
    "GROUP_BODY",
    "Backend",
    "BaseBackend",
    "BaseDictBackend",
    "BaseKeyValueStoreBackend",
    "DisabledBackend",
    "KeyValueStoreBackend",
    "SyncBackendMixin",
    "TaskIdOf",
    "celery_meta",
    "custom_result",
    "exception_from_entry",
    "failure_exception",
    "failure_traceback",
    "get_current_task",
    "job_failure",
    "job_result",
    "job_state",
    "lookup_job",
    "never_ran",
    "root_failure",
    "update_state",
    "upstream_exception",
]

#: Gives the Celery task id of a job id (to name a chord's failed member).
TaskIdOf = Callable[[int], str]

#: ``meta["celery"]`` key (True) of a member of a group that is a chord's body: when the
#: header fails it fails with the header member's own exception, as in Celery 5.7
#: (``_handle_group_chord_error``), not with a body's ``ChordError``.
GROUP_BODY = "group_body"

#: The name the worker's update_state warnings have always been logged under.
logger = logging.getLogger("akadze_compat.entry")

FINISHED = {"succeeded": states.SUCCESS, "failed": states.FAILURE,
             "cancelled": states.REVOKED}
_MODULE_NAME = re.compile(r"^[A-Za-z_][\w.]*$")
_made_types: dict[tuple[str, str], type[Exception]] = {}
_made_types_lock = threading.Lock()


class _WithMeta(Protocol):
    """A ``Job``, or a running job's ``JobContext``: anything holding a job's meta."""

    @property
    def meta(self) -> Any: ...


def celery_meta(job: _WithMeta) -> dict[str, Any]:
    """The Celery part of a job's meta (``{}`` for jobs not sent by the facade)."""
    meta = job.meta.get("celery") if isinstance(job.meta, dict) else None
    return meta if isinstance(meta, dict) else {}


def job_state(job: Job | None, track_started: bool = False) -> str:
    """The Celery state of a job (PENDING for no job).

    A running job shows its custom state (``update_state``), else STARTED with
    ``track_started``, else what Celery would still show: PENDING, or RETRY after a retry.
    """
    if job is None:
        return states.PENDING
    if job.state in FINISHED:
        meta = celery_meta(job)
        if meta.get("ignored"):
            # raise Ignore(): Celery stored nothing, so the state is the body's custom one
            # (update_state) or PENDING
            return str(meta.get("state") or states.PENDING)
        if never_ran(job):
            # A chain step that never ran: Celery's _fail_chain stores the failure that
            # stopped the chain in every later step (FAILURE); a revoke stores nothing in
            # them (PENDING), nor does a failure in the tasks of a group (or a chord's
            # header) after the failed step, which Celery never sends (the engine's
            # "entered": the failure came from outside the group).
            entry = job.errors[-1]
            return states.FAILURE if root_failure(entry) is not None \
                and not entry.get("entered") else states.PENDING
        return FINISHED[job.state]
    if job.state == "waiting":
        return states.PENDING
    if job.state == "queued":
        return states.PENDING if job.attempt == 0 else states.RETRY
    custom = celery_meta(job).get("state")
    if custom:
        return str(custom)
    if track_started:
        return states.STARTED
    return states.PENDING if job.attempt <= 1 else states.RETRY


# Errors the engine itself records (no module, or akadze_core's), as Celery's exceptions, so
# `except akadze_compat.exceptions.NotRegistered` catches what a worker reported.
_ENGINE_ERRORS = {
    "NotRegistered": "NotRegistered",
    "WorkerLost": "WorkerLostError",
    "JobTimeout": "TimeLimitExceeded",
}


def _exception_type(module: str | None, name: str) -> type[Exception]:
    """The exception class called ``name`` in ``module``, or a stand-in of that name.

    ``module`` comes from a row, so it is only looked up among the modules this process has
    already imported (``sys.modules``), never imported: an import runs the module's code,
    and a row naming ``unittest.__main__`` or a project script would run it here (Celery
    5.7 does the same since CVE-2021-23727). The attribute is read from the module's own
    namespace, not with ``getattr``, so a module ``__getattr__`` (a lazy importer) is not
    called either; and only an ``Exception`` subclass is used (a ``SystemExit`` named by a
    row would stop the reader)."""
    if name in _ENGINE_ERRORS and (not module or module.startswith("akadze_core")):
        return getattr(exceptions, _ENGINE_ERRORS[name])  # type: ignore[no-any-return]
    module_name = module or "builtins"
    if _MODULE_NAME.match(module_name):
        found = sys.modules.get(module_name)
        namespace = getattr(found, "__dict__", None) if found is not None else None
        cls = namespace.get(name) if isinstance(namespace, dict) else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls
    return _stand_in(module, name)


def _stand_in(module: str | None, name: str) -> type[Exception]:
    """An Exception subclass called ``name`` (in ``module``), made once: what a failure
    whose class cannot be found or built comes back as (Celery makes one too)."""
    key = (module or "builtins", name)
    with _made_types_lock:
        if key not in _made_types:
            identifier = name if name.isidentifier() else "RemoteError"
            _made_types[key] = type(identifier, (Exception,), {"__module__": key[0]})
        return _made_types[key]


def exception_from_entry(entry: dict[str, Any]) -> Exception:
    """Rebuild the exception an error entry describes: its type called with the arguments
    it was raised with (as Celery's JSON results do, ``cls(*exc_message)``), or with its
    message for an entry without them (written before they were kept); an
    ``UnpickleableExceptionWrapper`` when that call fails."""
    cls = _exception_type(entry.get("module"), str(entry.get("type") or "Exception"))
    message = entry.get("message") or ""
    args = entry.get("args")
    arguments = tuple(args) if isinstance(args, list) else ((message,) if message else ())
    try:
        exc = cls(*arguments)
    except Exception:
        # A constructor that wants other arguments (or a class that cannot be made from
        # outside, such as pydantic's ValidationError): Celery's wrapper, naming the
        # class and holding the arguments.
        return UnpickleableExceptionWrapper(entry.get("module"), cls.__name__, arguments)
    return exc


def _upstream_failed(entry: dict[str, Any] | None) -> bool:
    """Whether an error entry is the engine's: an upstream of a workflow job failed."""
    return isinstance(entry, dict) and entry.get("type") == "UpstreamFailed" \
        and "upstream" in entry and not entry.get("module")


def never_ran(job: Job) -> bool:
    """Whether the job was cancelled because a job it waited on failed or was cancelled
    (a chain step after a failure): it never ran."""
    return job.state == "cancelled" and bool(job.errors) and _upstream_failed(job.errors[-1])


def root_failure(entry: dict[str, Any]) -> dict[str, Any] | None:
    """For the ``UpstreamFailed`` entry of a job that never ran: the failure entry of the job
    that stopped it (followed through upstreams that never ran either), or None when that
    job was revoked (cancelled) rather than failed."""
    seen = 0
    while _upstream_failed(entry) and seen < 100:
        seen += 1
        inner = entry.get("upstream_error")
        if entry.get("upstream_state") == "cancelled":
            if not isinstance(inner, dict) or not _upstream_failed(inner):
                return None  # revoked, or cancelled through akadze_core
            entry = inner
            continue
        return inner if isinstance(inner, dict) else {"type": "Exception",
                                                      "message": entry.get("message")}
    return None


def failure_traceback(job: Job) -> str | None:
    """The traceback of a job's failure: its last error entry's, or for a chain step that
    never ran the traceback of the failure that stopped it (Celery stores that in every
    later step)."""
    if not job.errors:
        return None
    entry = job.errors[-1]
    if never_ran(job):
        root = root_failure(entry)
        return root.get("traceback") if root is not None else None
    traceback = entry.get("traceback")
    return traceback if isinstance(traceback, str) else None


def upstream_exception(entry: dict[str, Any], task_id_of: TaskIdOf | None = None) \
        -> Exception:
    """The exception of the job an ``UpstreamFailed`` entry names (followed through
    upstreams that never ran either): its own (rebuilt), or ``TaskRevokedError`` when it was
    revoked."""
    root = root_failure(entry)
    if root is None:
        return TaskRevokedError("revoked")
    return failure_exception(root, task_id_of)


def failure_exception(entry: dict[str, Any], task_id_of: TaskIdOf | None = None) -> Exception:
    """The exception of a failure entry: the task's (rebuilt), or for a chord body that
    failed because a header member did, Celery's ``ChordError('Dependency <member id>
    raised <its exception>')``."""
    if not _upstream_failed(entry):
        return exception_from_entry(entry)
    culprit = entry["upstream"]
    culprit_id = task_id_of(int(culprit)) if task_id_of is not None else str(culprit)
    return ChordError(f"Dependency {culprit_id} raised {upstream_exception(entry, task_id_of)!r}")


def job_failure(job: Job | None, entry: dict[str, Any],
                task_id_of: TaskIdOf | None = None) -> Exception:
    """``failure_exception`` of ``job``'s failure ``entry``; for a member of a chord's
    group body failed by its header, the header member's own exception."""
    if job is not None and celery_meta(job).get(GROUP_BODY) and _upstream_failed(entry):
        return upstream_exception(entry, task_id_of)
    return failure_exception(entry, task_id_of)


def job_result(job: Job | None, state: str, task_id_of: TaskIdOf | None = None) -> Any:
    """The Celery ``result`` for a job in ``state``: value, exception or custom metadata.
    ``task_id_of`` names a failed chord member by its task id (else by its job id)."""
    if job is None:
        return None
    meta = celery_meta(job)
    if meta.get("state") and state == meta["state"] and (job.state not in FINISHED
                                                         or meta.get("ignored")):
        return custom_result(state, revive(meta.get("result")))
    if state == states.SUCCESS:
        return revive(job.result)
    if state == states.REVOKED:
        # Celery's reason: "terminated" for a revoke(terminate=True) that ended the process.
        last = job.errors[-1] if job.errors else None
        terminated = isinstance(last, dict) and last.get("type") == "Terminated"
        return TaskRevokedError("terminated" if terminated else "revoked")
    if state == states.FAILURE and never_ran(job):
        return upstream_exception(job.errors[-1], task_id_of)
    if state in (states.FAILURE, states.RETRY):
        entry = job.errors[-1] if job.errors else None
        if entry is None or (state == states.RETRY and entry.get("type") == "Retry"):
            return None
        return job_failure(job, entry, task_id_of)
    return None


def custom_result(state: str, meta: Any) -> Any:
    """The ``result`` of a state a body stored with ``update_state``: its metadata, or in
    an exception state (FAILURE, RETRY, REVOKED) with Celery's ``{"exc_type": ...,
    "exc_message": ..., "exc_module": ...}`` metadata, that exception, rebuilt as Celery
    does: the class named (a stand-in of that name when it cannot be found) called with
    the message's arguments. Nothing is imported (see ``_exception_type``)."""
    if state not in states.EXCEPTION_STATES or not isinstance(meta, dict) \
            or not isinstance(meta.get("exc_type"), str):
        return meta
    message = meta.get("exc_message", "")
    args = message if isinstance(message, list) else [message]
    module = meta.get("exc_module")
    return exception_from_entry({"type": meta["exc_type"].rsplit(".", 1)[-1],
                                 "module": module if isinstance(module, str) else None,
                                 "message": str(message), "args": args})


def lookup_job(core: CoreApp, task_id: str) -> Job | None:
    """The job of a Celery task id. A job is known by one id: its ``meta["task_id"]`` (the
    uuid4 a send gives it, or a ``task_id=`` the caller chose), else the id derived from its
    job id (``CoreApp.task_id_of``: a group's plain members, jobs enqueued through
    akadze_core); such a job also answers to its job id in digits, as before task ids were
    uuids."""
    if task_id.isdigit() and len(task_id) < 19:  # a bigint: longer digits are no job id
        job = core.get_job(int(task_id))
        if job is not None and job.meta.get("task_id") in (None, task_id):
            return job
    return core.find_job(task_id)


def update_state(task: Task, task_id: str | None, state: str | None, meta: Any) -> None:
    """``Task.update_state``: store a custom state and its metadata in the running job.

    Only the task this worker is running can be updated (no result backend to write other
    ids to); eagerly (and outside a worker) it does nothing, as Celery without a backend.
    """
    running = _state.worker_request.get()
    if running is None:
        if not task.request.is_eager:
            logger.warning("update_state(%r) outside a worker run does nothing", state)
        return
    request = running[1]
    task_id = task.request.id if task_id is None else str(task_id)
    if task_id != request.id:
        logger.warning("update_state: only the running task (%s) can be updated, not %s",
                       request.id, task_id)
        return
    stored = request.__dict__["_akadze_meta"]
    patch = {**stored, "state": state or states.PENDING, "result": meta}
    if current().update_meta_sync({"celery": patch}):
        stored.update(state=patch["state"], result=meta)
