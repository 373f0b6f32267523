"""Task results: ``AsyncResult`` reads the job row, ``EagerResult`` holds an eager run's,
``ResultSet`` and ``GroupResult`` hold several (a group's).

There is no separate result backend: a task's state, return value and errors are its job's
columns. The Celery state is derived from the job (``job_state``); the exception of a failed
task is rebuilt from the job's last error entry by type and module only, never unpickled.
``get()`` blocks on Postgres LISTEN/NOTIFY until the job finishes, it does not poll; a
group's ``get()`` reads its members in one query and waits on one LISTEN connection.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import _state, states
from .backends import groups as from_saved
from .backends.base import (
    FINISHED,
    failure_traceback,
    job_result,
    job_state,
    lookup_job,
    never_ran,
    upstream_exception,
)
from .exceptions import ImproperlyConfigured, IncompleteStream, TaskRevokedError, TimeoutError
from .serialization import revive
from .utils.graph import DependencyGraph, GraphFormatter

if TYPE_CHECKING:
    from akadze_core import Job

    from .app.base import Celery

__all__ = ["AsyncResult", "EagerResult", "GroupResult", "ResultBase", "ResultSet",
           "allow_join_result", "assert_will_not_block", "denied_join_result",
           "derived_results", "give_job_ids", "result_from_tuple"]

E_WOULDBLOCK = """\
Never call result.get() within a task!
See https://docs.celeryq.dev/en/latest/userguide/tasks.html\
#avoid-launching-synchronous-subtasks
"""

#: None: decided by whether a worker runs a task here; True/False: forced by the blocks.
_join_blocks: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "akadze_compat_join_blocks", default=None)


def task_join_will_block() -> bool:
    """Whether waiting for a result here is refused (inside a worker's task, unless
    ``allow_join_result()``)."""
    forced = _join_blocks.get()
    if forced is not None:
        return forced
    return _state.get_current_worker_request() is not None


def assert_will_not_block() -> None:
    """Refuse to wait for a result inside a running task (a deadlock risk, as in Celery)."""
    if task_join_will_block():
        raise RuntimeError(E_WOULDBLOCK)


@contextlib.contextmanager
def allow_join_result() -> Iterator[None]:
    """Allow ``result.get()`` inside a task (Celery's escape hatch; the task then holds a
    worker slot while it waits)."""
    token = _join_blocks.set(False)
    try:
        yield
    finally:
        _join_blocks.reset(token)


@contextlib.contextmanager
def denied_join_result() -> Iterator[None]:
    """Refuse ``result.get()`` in this block, even outside a task."""
    token = _join_blocks.set(True)
    try:
        yield
    finally:
        _join_blocks.reset(token)


class ResultBase:
    """Base class of results."""

    #: The result of the step before this one (a chain's), or None.
    parent: Any = None


class AsyncResult(ResultBase):
    """The result of a task call, read from its job (Celery's ``AsyncResult``)."""

    _id: str | None  # None: derived from the job id once known (derived_results)
    #: An unfinished job read with its set's other members (ResultSet._read_once), shown
    #: until that read's block ends; None outside it.
    _read: Job | None = None

    def __init__(self, id: str, backend: Any = None, task_name: str | None = None,
                 app: Celery | None = None, parent: AsyncResult | None = None, *,
                 job_id: int | None = None) -> None:
        if id is None:
            raise ValueError(f"AsyncResult requires valid id, not {type(id)}")
        self.app = app or _state.get_current_app()
        self.id = str(id)
        self.backend = backend if backend is not None else self.app.backend
        self.parent = parent
        self.task_name = task_name
        self._job_id = job_id
        self._cache: Job | None = None
        self.ignored = False

    @classmethod
    def of_job(cls, app: Celery, task_name: str, job_id: int, *,
               ignored: bool) -> AsyncResult:
        """The result of a job sent without a task id, whose id is derived from ``job_id``
        when first read (``id``): the object ``AsyncResult("", app=app, task_name=...,
        job_id=...)`` with ``id = None`` and ``ignored`` set is, made without ``__init__``'s
        per-argument checks and two ``id`` setter calls (a plain ``delay()`` makes one per
        call)."""
        result = cls.__new__(cls)
        # Set one by one in __init__'s order, not as a new __dict__: the instance keeps the
        # class's shared-key dict (a dict assigned whole is built and stored as a dict of
        # its own), which makes this about 40 % cheaper and its dict half the size.
        result.app = app
        result._id = None
        result.backend = app.backend
        result.parent = None
        result.task_name = task_name
        result._job_id = job_id
        result._cache = None
        result.ignored = ignored
        return result

    @property
    def id(self) -> str:
        """The task id."""
        task_id = self._id
        if task_id is None:
            # A group member known by the id derived from its job id (derived_results),
            # worked out when first asked for: a group of 10,000 formats no id nobody reads.
            if self._job_id is None:
                raise RuntimeError("this result's task id is known once its job is inserted")
            task_id = self._id = self.app.core.task_ids().derive(self._job_id)
        return task_id

    @id.setter
    def id(self, value: str) -> None:
        self._id = value

    # --- reading the job ---------------------------------------------------------------------

    def _task_id_of(self, job_id: int) -> str:
        """The Celery task id of another job (a chord's failed member)."""
        job = self.app.core.get_job(job_id)
        if job is None:
            return str(job_id)
        return self.app.core.task_id_of(job)

    def _move_to(self, job_id: int) -> None:
        """Make job ``job_id`` this result's job (the replacement of its job: Task.replace).
        A task id derived from a job id is the one of the job sent, worked out before the
        job id changes (the replacement carries it in its meta)."""
        if self._id is None and self._job_id is not None and job_id != self._job_id:
            self._id = self.app.core.task_ids().derive(self._job_id)
        self._job_id = job_id

    def _remember(self, job: Job) -> None:
        """Keep a job read elsewhere (a group's read of all its members)."""
        if job.meta.get("replaced_by"):
            # Task.replace: the replacement is this result's job now (read when needed).
            self._move_to(int(job.meta["replaced_by"]))
            self._cache = None
            return
        self._move_to(job.id)
        if job.state in FINISHED:
            self._cache = job

    def _job(self) -> Job | None:
        if self._cache is not None:
            return self._cache
        if self._read is not None:
            return self._read
        core = self.app.core
        job = core.get_job(self._job_id) if self._job_id is not None \
            else lookup_job(core, self.id)
        while job is not None and job.meta.get("replaced_by"):
            # Task.replace: the job handed its task id over (app.replace).
            job = core.get_job(int(job.meta["replaced_by"]))
        if job is not None:
            self._move_to(job.id)
            if job.state in FINISHED:
                self._cache = job
        return job

    def _track_started(self, job: Job | None) -> bool:
        task = self.app.registry.get(job.task if job else self.task_name or "")
        if task is not None and task.track_started is not None:
            return bool(task.track_started)
        return bool(self.app.conf.task_track_started)

    def _get_task_meta(self) -> dict[str, Any]:
        """Celery's meta dict of this task (``status``, ``result``, ``traceback``,
        ``children``, ``date_done``, ``task_id``), read from its job now."""
        return dict(self.app.backend.get_task_meta(self.id))

    def _meta(self) -> tuple[Job | None, str]:
        job = self._job()
        return job, job_state(job, self._track_started(job))

    @property
    def state(self) -> str:
        """PENDING, STARTED, RETRY, SUCCESS, FAILURE, REVOKED or a custom state."""
        return self._meta()[1]

    status = state

    @property
    def result(self) -> Any:
        """The return value; on FAILURE the exception; for a custom state its metadata."""
        job, state = self._meta()
        return job_result(job, state, self._task_id_of)

    info = result

    @property
    def traceback(self) -> str | None:
        """The traceback text of the last failure, if any."""
        job, state = self._meta()
        if job is None or state not in (states.FAILURE, states.RETRY):
            return None
        return failure_traceback(job)

    def ready(self) -> bool:
        """Whether the task finished (SUCCESS, FAILURE or REVOKED)."""
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        """Whether the task succeeded."""
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        """Whether the task failed."""
        return self.state == states.FAILURE

    def exists(self) -> bool:
        """Whether a job exists for this id (PENDING alone cannot tell)."""
        return self._job() is not None

    @property
    def task_id(self) -> str:
        """Old name of ``id``."""
        return self.id

    @property
    def job_id(self) -> int | None:
        """The akadze_core job behind this task id (not in Celery), None when there is none:
        what ``app.core.get_job`` and SQL on ``akadze.jobs`` take. Task ids are uuid4
        strings kept in the job's ``meta["task_id"]``, not job ids."""
        if self._job_id is None:
            self._job()
        return self._job_id

    @job_id.setter
    def job_id(self, value: int | None) -> None:
        # Set by a canvas send once its workflow is inserted (the ids come back in order).
        self._job_id = value
        self._cache = None

    @property
    def name(self) -> str | None:
        """The task name."""
        job = self._job()
        return job.task if job else self.task_name

    @property
    def args(self) -> list[Any] | None:
        """The positional arguments of the call."""
        job = self._job()
        return revive(job.args.get("args")) if job and isinstance(job.args, dict) else None

    @property
    def kwargs(self) -> dict[str, Any] | None:
        """The keyword arguments of the call."""
        job = self._job()
        return revive(job.args.get("kwargs")) if job and isinstance(job.args, dict) else None

    @property
    def retries(self) -> int | None:
        """How many times the task was retried so far."""
        job = self._job()
        if job is None:
            return None
        return job.attempt if job.state == "queued" else max(0, job.attempt - 1)

    @property
    def queue(self) -> str | None:
        """The queue the job is in."""
        job = self._job()
        return job.queue if job else None

    @property
    def worker(self) -> str | None:
        """Not recorded (Celery's ``result_extended``); always None."""
        return None

    @property
    def date_done(self) -> datetime | None:
        """When the task finished (UTC), or None."""
        job = self._job()
        return job.finished_at if job and job.state in FINISHED else None

    @property
    def children(self) -> list[AsyncResult] | None:
        """The results of the canvas steps that wait for this task (the next step of its
        chain, its chord body, its ``link`` callbacks), once it finished; None before,
        as Celery (which knows them only when the task's result is stored)."""
        job = self._job()
        if job is None or job.state not in FINISHED:
            return None
        dependents = list(job.dependents or ())
        if not dependents:
            return []
        found = self.app.core.get_jobs(dependents)
        children = []
        for job_id in dependents:
            child = found.get(job_id)
            if child is None:
                continue
            result = AsyncResult(self.app.core.task_id_of(child), app=self.app,
                                 task_name=child.task, job_id=child.id)
            result._remember(child)
            children.append(result)
        return children

    def iterdeps(self, intermediate: bool = False) -> Iterator[tuple[AsyncResult | None,
                                                                      AsyncResult]]:
        """``(parent, child)`` for this result and, depth first, its children's; raises
        ``IncompleteStream`` for a child not ready unless ``intermediate``."""
        stack: list[tuple[AsyncResult | None, AsyncResult]] = [(None, self)]
        while stack:
            parent, node = stack.pop()
            yield parent, node
            if node.ready():
                stack.extend((node, child) for child in reversed(node.children or []))
            elif not intermediate:
                raise IncompleteStream()

    def build_graph(self, intermediate: bool = False, formatter: Any = None) -> Any:
        """A ``DependencyGraph`` of this result and its children (``iterdeps``): each
        result depends on its children, as in Celery's; ``IncompleteStream`` for a child
        not ready unless ``intermediate``."""
        graph = DependencyGraph(formatter=formatter or GraphFormatter(root=self.id,
                                                                      shape="oval"))
        for parent, node in self.iterdeps(intermediate=intermediate):
            graph.add_arc(node)
            if parent is not None:
                graph.add_edge(parent, node)
        return graph

    @property
    def graph(self) -> Any:
        """``build_graph()``, built once per result object (Celery's cached property)."""
        cached = self.__dict__.get("_graph")
        if cached is None:
            cached = self.__dict__["_graph"] = self.build_graph()
        return cached

    def get_leaf(self) -> Any:
        """The value of the last result ``iterdeps`` reaches (each waited for)."""
        value = None
        for _, node in self.iterdeps():
            value = node.get()
        return value

    def collect(self, intermediate: bool = False, **kwargs: Any) -> Iterator[tuple[
            AsyncResult, Any]]:
        """``(result, value)`` for this result and its children, depth first, each
        waited for (Celery's ``collect``)."""
        for _, node in self.iterdeps(intermediate=intermediate):
            yield node, node.get(**kwargs)

    # --- waiting ------------------------------------------------------------------------------

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            no_ack: bool = True, follow_parents: bool = True,
            callback: Callable[[str, Any], Any] | None = None, on_message: Any = None,
            on_interval: Any = None, disable_sync_subtasks: bool = True,
            EXCEPTION_STATES: frozenset[str] = states.EXCEPTION_STATES,
            PROPAGATE_STATES: frozenset[str] = states.PROPAGATE_STATES,
            ) -> Any:
        """Wait until the task finishes and return its result (or raise its exception).

        With ``propagate`` and ``follow_parents``, as Celery, the parents (the steps before
        this one: a chain's, a chord's header) are checked first, from the root down, before
        and after waiting: a failed one raises its own exception (so a chord whose header
        member failed raises that member's exception, not the body's ``ChordError``). A
        result made from an id alone has no parents. Raises
        ``akadze_compat.exceptions.TimeoutError`` after ``timeout`` seconds. Returns None at
        once for a call made with ``ignore_result``.
        """
        if self.ignored:
            return None
        if disable_sync_subtasks:
            assert_will_not_block()
        follow = follow_parents and propagate and self.parent is not None
        if follow:
            self._maybe_reraise_parent_error()
        job = self._job()
        # Read only when there is something to wait for: on a ready result Celery never
        # looks at the timeout, so a value that is not a number (celery-progress passes the
        # task id there) is ignored.
        deadline = None if timeout is None or (job is not None and job.state in FINISHED) \
            else time.monotonic() + timeout
        while job is None:
            # A task_id= given to a job that is not committed yet: look again now and then.
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("The operation timed out.")
            time.sleep(interval if deadline is None else
                       max(0.0, min(interval, deadline - time.monotonic())))
            job = self._job()
        if job.state not in FINISHED:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job = self.app.core.wait_for_job(job.id, left)
                while job.meta.get("replaced_by"):
                    # Replaced while waited on (Task.replace): wait for the replacement.
                    self._cache = None
                    self._move_to(int(job.meta["replaced_by"]))
                    job = self._job() or job
                    if job.state not in FINISHED:
                        left = None if deadline is None else \
                            max(0.0, deadline - time.monotonic())
                        job = self.app.core.wait_for_job(job.id, left)
            except builtins.TimeoutError:  # the core's; ours shadows the name
                raise TimeoutError("The operation timed out.") from None
            self._cache = job
        if follow:
            # Celery's last on_interval check, once the result arrived.
            self._maybe_reraise_parent_error()
        if propagate and never_ran(job) and self.state == states.PENDING:
            # A step that never ran because a step before it was revoked: Celery leaves it
            # PENDING and its get() raises through the parents above, or waits forever when
            # there are none; here it raises the revoke at once.
            raise upstream_exception(job.errors[-1], self._task_id_of)
        return self.maybe_throw(propagate=propagate, callback=callback)

    wait = get

    def _parents(self) -> Iterator[Any]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def _maybe_reraise_parent_error(self) -> None:
        """Raise the first failure among the parents, from the root down (Celery's)."""
        for node in reversed(list(self._parents())):
            node.maybe_throw()

    def maybe_throw(self, propagate: bool = True, callback: Callable[[str, Any], Any] | None =
                    None) -> Any:
        """Raise the task's exception if it failed (with ``propagate``); else return the
        result. A chain step that never ran because a step before it failed reads FAILURE
        with that step's exception, as in Celery (whose ``_fail_chain`` stores it there)."""
        job, state = self._meta()
        value = job_result(job, state, self._task_id_of)
        if state in states.PROPAGATE_STATES and propagate:
            raise value if isinstance(value, BaseException) else Exception(value)
        if callback is not None:
            callback(self.id, value)
        return value

    maybe_reraise = maybe_throw

    # --- acting on the task -------------------------------------------------------------------

    def forget(self) -> None:
        """Drop the cached result. The job itself is removed by retention (result_expires)."""
        self._cache = None
        if self.parent:
            self.parent.forget()

    def revoke(self, connection: Any = None, terminate: bool = False, signal: Any = None,
               wait: bool = False, timeout: float | None = None) -> None:
        """Cancel the task: a queued task never runs; a running one is not interrupted
        unless ``terminate=True`` (prefork: its process gets ``signal``, see
        ``Control.revoke``)."""
        self.app.control.revoke(self.id, connection=connection, terminate=terminate,
                                signal=signal, reply=wait, timeout=timeout)

    def as_tuple(self) -> tuple[Any, ...]:
        """``((id, parent), None)``, Celery's serialized form."""
        parent = self.parent
        return (self.id, parent and parent.as_tuple()), None

    def as_list(self) -> list[str]:
        """This id, then the parents' ids."""
        return [self.id, *(self.parent.as_list() if self.parent else [])]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id}>"

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __copy__(self) -> AsyncResult:
        return type(self)(self.id, self.backend, self.task_name, self.app, self.parent,
                          job_id=self._job_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, None, self.task_name, None, self.parent))


def derived_results(app: Celery, backend: Any, task_name: str | None,
                    count: int, *, ignored: bool = False) -> list[AsyncResult]:
    """The results of ``count`` jobs sent without task ids: each known by the id derived
    from its job id (``CoreApp.task_id_of``) once its ``job_id`` is set by the insert.
    ``ignored``: whether their results are ignored. Copies of one result built in full (a
    10,000-member group builds one, not 10,000)."""
    first = AsyncResult("", backend, task_name, app)
    first._id = None
    first.ignored = ignored
    fields = first.__dict__
    new = object.__new__
    results = [first]
    for _ in range(count - 1):
        result = new(AsyncResult)
        # A copy of the fields given as its dict: half the time of filling the dict of a
        # new instance (update) for a 10,000-member group.
        result.__dict__ = fields.copy()
        results.append(result)
    return results[:count]


def give_job_ids(results: list[AsyncResult], job_ids: Iterable[int | None]) -> None:
    """Give each of ``results`` (``derived_results``', which have read nothing yet) its job
    id, in order, as the ``job_id`` setter does (no cache to drop): without a setter call
    per result (1.3 -> 0.4 ms for a 10,000-member group)."""
    for result, job_id in zip(results, job_ids, strict=False):
        result._job_id = job_id


class EagerResult(AsyncResult):
    """The result of a task run eagerly (``apply()`` or ``task_always_eager``)."""

    def __init__(self, id: str, ret_value: Any, state: str, traceback: str | None = None,
                 name: str | None = None) -> None:
        self.id = id
        # A subclass may set these before calling this (celery-progress's KnownResult sets
        # backend = DisabledBackend, whose state sets its ready() reads): kept, as in Celery,
        # whose EagerResult sets neither.
        if "app" not in self.__dict__:
            self.app = None  # type: ignore[assignment]
        if "backend" not in self.__dict__:
            self.backend = None
        self.parent = None
        self.task_name = name
        self._result = ret_value
        self._state = state
        self._traceback = traceback
        self._name = name
        self._job_id = None
        self._cache = None
        self.ignored = False

    @property  # type: ignore[override]
    def id(self) -> str | None:  # type: ignore[override]
        """The task id (None for a result made without one, as Celery allows:
        celery-once answers a refused call with ``EagerResult(None, None, REJECTED)``)."""
        return self._id

    @id.setter
    def id(self, value: str | None) -> None:
        self._id = value

    def _get_task_meta(self) -> dict[str, Any]:
        """The meta of the eager run (nothing is stored)."""
        return {"task_id": self.id, "result": self._result, "status": self._state,
                "traceback": self._traceback, "name": self._name}

    @property
    def state(self) -> str:
        """The state the eager run ended in."""
        return self._state

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception."""
        return self._result

    info = result

    @property
    def traceback(self) -> str | None:
        """The traceback text of the failure, if any."""
        return self._traceback

    @property
    def name(self) -> str | None:
        """The task name."""
        return self._name

    def ready(self) -> bool:
        """Always True: the task already ran."""
        return True

    def exists(self) -> bool:
        """Always True."""
        return True

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            no_ack: bool = True, follow_parents: bool = True,
            callback: Callable[[str, Any], Any] | None = None, on_message: Any = None,
            on_interval: Any = None, disable_sync_subtasks: bool = True,
            EXCEPTION_STATES: frozenset[str] = states.EXCEPTION_STATES,
            PROPAGATE_STATES: frozenset[str] = states.PROPAGATE_STATES,
            ) -> Any:
        """The return value; the exception is raised (``propagate``) or returned."""
        if self.successful():
            return self._result
        if self._state in states.PROPAGATE_STATES:
            if propagate:
                raise self._result if isinstance(self._result, Exception) \
                    else Exception(self._result)
            return self._result
        return None

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> Any:
        """Raise the exception of a failed run (with ``propagate``); else return the result."""
        if self._state in states.PROPAGATE_STATES and propagate:
            raise self._result if isinstance(self._result, Exception) \
                else Exception(self._result)
        if callback is not None:
            callback(self.id, self._result)
        return self._result

    def forget(self) -> None:
        """Nothing is stored for an eager result."""

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        """Mark the result REVOKED (the task already ran, nothing is cancelled)."""
        self._state = states.REVOKED
        self._result = TaskRevokedError("revoked")
        self._traceback = None

    def __repr__(self) -> str:
        return f"<EagerResult: {self.id}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, self._result, self._state, self._traceback, self._name))


def stored_value(value: Any) -> Any:
    """A task's return value as its job stores it: a result (the task returned an
    ``AsyncResult`` or ``GroupResult``) as its ``as_tuple()``, as Celery's backends store one
    with any serializer but pickle (``result_from_tuple`` rebuilds it); else as it is."""
    return value.as_tuple() if isinstance(value, (AsyncResult, GroupResult)) else value


def _job_results(results: list[Any]) -> list[AsyncResult]:
    """The members read from the database (not eager ones), nested sets included."""
    found: list[AsyncResult] = []
    for result in results:
        if isinstance(result, ResultSet):
            found.extend(_job_results(result.results))
        elif isinstance(result, AsyncResult) and not isinstance(result, EagerResult):
            found.append(result)
    return found


class ResultSet(ResultBase):
    """Several results, in order (``ResultSet([r1, r2])``); ``get()`` waits for all of
    them and returns their values in that order."""

    def __init__(self, results: list[Any] | None, app: Celery | None = None,
                 ready_barrier: Any = None, **kwargs: Any) -> None:
        self._app = app
        self.results: list[Any] = list(results) if results is not None else []

    @property
    def app(self) -> Celery:
        """The app of the results (the first one's), else the current app."""
        if self._app is None:
            first = next((result for result in self.results
                          if getattr(result, "app", None) is not None), None)
            self._app = first.app if first is not None else _state.get_current_app()
        return self._app

    @app.setter
    def app(self, app: Celery) -> None:
        self._app = app

    # --- the members -------------------------------------------------------------------------

    def add(self, result: Any) -> None:
        """Add ``result`` unless it is a member already."""
        if result not in self.results:
            self.results.append(result)

    def remove(self, result: Any) -> None:
        """Remove ``result`` (an id or a result); ``KeyError`` if it is not a member."""
        if isinstance(result, str):
            result = self.app.AsyncResult(result)
        try:
            self.results.remove(result)
        except ValueError:
            raise KeyError(result) from None

    def discard(self, result: Any) -> None:
        """Remove ``result`` if it is a member."""
        with contextlib.suppress(KeyError):
            self.remove(result)

    def update(self, results: Any) -> None:
        """Add the results that are not members yet."""
        self.results.extend(result for result in results if result not in self.results)

    def clear(self) -> None:
        """Remove every member."""
        self.results[:] = []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    def __len__(self) -> int:
        return len(self.results)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResultSet):
            return other.results == self.results
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as Celery's

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: [{', '.join(str(r.id) for r in self.results)}]>"

    # --- state: one query for every member ----------------------------------------------

    def _refresh(self, show: bool = False) -> list[AsyncResult]:
        """Read every unfinished member's job in one query: a finished one is kept by its
        result for good; with ``show``, an unfinished one is shown by its result
        (``_read``) until the caller clears it, and those results are returned
        (``_read_once``)."""
        pending = [result for result in _job_results(self.results)
                   if result._cache is None]
        known = [result for result in pending if result._job_id is not None]
        if not known:
            return []
        jobs = self.app.core.get_jobs(int(result._job_id)  # type: ignore[arg-type]
                                      for result in known)
        shown = []
        for result in known:
            job = jobs.get(result._job_id)  # type: ignore[arg-type]
            if job is None:
                continue
            result._remember(job)
            if show and result._cache is None and result._job_id == job.id:  # not replaced
                result._read = job
                shown.append(result)
        return shown

    @contextlib.contextmanager
    def _read_once(self) -> Iterator[None]:
        """Within the block every member's state comes from one query (``_refresh``):
        without it, each unfinished member was read again by a query of its own (10,000
        of them when ``get()`` of a chord's body checked its header)."""
        shown = self._refresh(show=True)
        try:
            yield
        finally:
            for result in shown:
                result._read = None

    def successful(self) -> bool:
        """Whether every task succeeded."""
        with self._read_once():
            return all(result.successful() for result in self.results)

    def failed(self) -> bool:
        """Whether any task failed."""
        with self._read_once():
            return any(result.failed() for result in self.results)

    def waiting(self) -> bool:
        """Whether any task is not finished yet."""
        with self._read_once():
            return any(not result.ready() for result in self.results)

    def ready(self) -> bool:
        """Whether every task finished (succeeded, failed or revoked)."""
        with self._read_once():
            return all(result.ready() for result in self.results)

    def completed_count(self) -> int:
        """How many tasks succeeded."""
        with self._read_once():
            return sum(int(result.successful()) for result in self.results)

    def maybe_throw(self, callback: Any = None, propagate: bool = True) -> None:
        """Raise the first failed task's exception (in order)."""
        with self._read_once():
            for result in self.results:
                result.maybe_throw(callback=callback, propagate=propagate)

    maybe_reraise = maybe_throw

    def forget(self) -> None:
        """Forget every result (drop what is cached)."""
        for result in self.results:
            result.forget()

    def revoke(self, connection: Any = None, terminate: bool = False, signal: Any = None,
               wait: bool = False, timeout: float | None = None) -> None:
        """Revoke every task: queued or waiting ones never run (nor what waits on them)."""
        self.app.control.revoke([result.id for result in self.results],
                                connection=connection, timeout=timeout,
                                terminate=terminate, signal=signal, reply=wait)

    # --- waiting ------------------------------------------------------------------------------

    @property
    def supports_native_join(self) -> bool:
        """Always True: ``join`` and ``join_native`` wait the same way."""
        return True

    def get(self, timeout: float | None = None, propagate: bool = True,
            interval: float = 0.5, callback: Callable[[str, Any], Any] | None = None,
            no_ack: bool = True, on_message: Any = None, disable_sync_subtasks: bool = True,
            on_interval: Any = None) -> Any:
        """``join``: the values in order."""
        return self.join(timeout=timeout, propagate=propagate, interval=interval,
                         callback=callback, no_ack=no_ack, on_message=on_message,
                         disable_sync_subtasks=disable_sync_subtasks,
                         on_interval=on_interval)

    def join(self, timeout: float | None = None, propagate: bool = True,
             interval: float = 0.5, callback: Callable[[str, Any], Any] | None = None,
             no_ack: bool = True, on_message: Any = None, disable_sync_subtasks: bool = True,
             on_interval: Any = None) -> Any:
        """Wait for the tasks and return their values in order (a failed one raises its
        exception with ``propagate``, else its place holds the exception; with
        ``callback`` it is called ``(task_id, value)`` per task and the list is empty).

        In order, as Celery: the first failure (in order) is raised once it and the tasks
        before it finished. Waiting is one LISTEN connection woken by the jobs' NOTIFY, one
        query reading every unfinished member per wake-up; ``TimeoutError`` after
        ``timeout`` seconds.
        """
        if disable_sync_subtasks:
            assert_will_not_block()
        if on_message is not None:
            raise ImproperlyConfigured("Backend does not support on_message callback")
        deadline = None if timeout is None else time.monotonic() + timeout
        values: list[Any] = []
        for result in self.results:
            if isinstance(result, AsyncResult) and not isinstance(result, EagerResult) \
                    and result._cache is None:
                self._wait_from(result, deadline, propagate)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            value = result.get(timeout=left, propagate=propagate, interval=interval,
                               disable_sync_subtasks=False)
            if callback is not None:
                callback(result.id, value)
            else:
                values.append(value)
        return values

    join_native = join

    def _wait_from(self, first: AsyncResult, deadline: float | None, propagate: bool) -> None:
        """Wait until ``first`` finished: with ``propagate`` for it alone (a failure in
        order is raised as soon as Celery would); else for every unfinished member at once
        (its value is read after all of them anyway)."""
        self._refresh()
        if first._cache is not None:
            return
        members = [first] if propagate else [
            result for result in _job_results(self.results) if result._cache is None]
        if any(result._job_id is None for result in members):
            return  # not inserted yet (a task_id= being committed): get() looks it up
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            jobs = self.app.core.wait_for_jobs(
                [result._job_id for result in members], left)  # type: ignore[misc]
        except builtins.TimeoutError:
            raise TimeoutError("join operation timed out") from None
        for result in members:
            job = jobs.get(result._job_id)  # type: ignore[arg-type]
            if job is not None:
                result._remember(job)
        self._refresh()

    def iterate(self, timeout: float | None = None, propagate: bool = True,
                interval: float = 0.5) -> Iterator[Any]:
        """Each value in order, as it is ready."""
        yield from self.join(timeout=timeout, propagate=propagate, interval=interval)


class GroupResult(ResultSet):
    """The results of a group: a ``ResultSet`` with the group's id (and ``parent``, the
    step before the group in a chain)."""

    def __init__(self, id: str | None = None, results: list[Any] | None = None,
                 parent: Any = None, **kwargs: Any) -> None:
        self.id = id
        self.parent = parent
        super().__init__(results, **kwargs)

    @property
    def children(self) -> list[Any]:
        """The members' results."""
        return self.results

    def as_tuple(self) -> tuple[Any, ...]:
        """``((id, parent), [member tuples])``, Celery's serialized form."""
        return ((self.id, self.parent and self.parent.as_tuple()),
                [result.as_tuple() for result in self.results])

    def save(self, backend: Any = None) -> GroupResult:
        """Store the group (its id and members' ids) for ``GroupResult.restore(id)``."""
        from_saved.save(self.app, str(self.id), self.as_tuple())
        return self

    def delete(self, backend: Any = None) -> None:
        """Remove what ``save`` stored."""
        from_saved.delete(self.app, str(self.id))

    @classmethod
    def restore(cls, id: str, backend: Any = None, app: Celery | None = None
                ) -> GroupResult | None:
        """The group saved under ``id`` (None if it was not saved)."""
        app = app or _state.get_current_app()
        saved = from_saved.load(app, str(id))
        if saved is None:
            return None
        restored = result_from_tuple(saved, app)
        return restored if isinstance(restored, GroupResult) else None

    def __bool__(self) -> bool:
        return bool(self.id or self.results)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GroupResult):
            return other.id == self.id and other.results == self.results \
                and other.parent == self.parent
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:  # type: ignore[override]  # a group hashes by its id
        return hash(self.id)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__}: {self.id} "
                f"[{', '.join(str(r.id) for r in self.results)}]>")

    def __str__(self) -> str:
        return str(self.id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, self.results, self.parent))


def result_from_tuple(value: Any, app: Celery | None = None) -> Any:
    """A result from its ``as_tuple()`` form (a ``GroupResult`` for a group's)."""
    if isinstance(value, ResultBase):
        return value
    app = app or _state.get_current_app()
    head, nodes = value
    task_id, parent = head if isinstance(head, (list, tuple)) else (head, None)
    parent_result = result_from_tuple(parent, app) if parent else None
    if nodes is not None:
        return GroupResult(task_id, [result_from_tuple(node, app) for node in nodes],
                           parent=parent_result, app=app)
    return AsyncResult(task_id, app=app, parent=parent_result)
