"""Tasks and the ways to enqueue them: now, later, in the caller's transaction, in bulk."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import psycopg

from ..model.errors import InvalidArgs, SchemaMissing
from ..model.limits import Rate, check_concurrency, parse_rate
from ..model.retry import BackoffPolicy
from ..model.serialization import (
    MAX_NAME_LENGTH,
    Dumps,
    check_name,
    encode_args,
)
from ..schedules.scheduler import ScheduleSpec
from ..store import database
from ..store.database import JobRequest
from ..store.dberrors import SCHEMA_ERRORS
from ..store.migrations import schema_missing
from ..store.queries import dialect
from .encoding import (
    BULK_CHUNK,
    POSITIONS,
    Chunk,
    Rows,
    checked_meta_texts,
    encode_chunk_items,
    encode_fast,
    encode_many,
    encode_pairs,
    encode_split,
    storable,
)

if TYPE_CHECKING:
    from ..schedules.scheduler import Schedule
    from ..schedules.triggers import Trigger
    from ..store.connections import Connections

T = TypeVar("T")


class TaskHost(Protocol):
    """What a task needs of the app it is registered in (an ``App`` is one): the
    connections its enqueues run on, how it encodes arguments, the command
    ``SchemaMissing`` names, and where its schedules are declared. A protocol, so that
    this module does not import the app that imports it."""

    @property
    def connections(self) -> Connections: ...

    @property
    def json_dumps(self) -> Dumps: ...

    @property
    def max_args_bytes(self) -> int: ...

    @property
    def migrate_command(self) -> str: ...

    def declare_schedule(self, name: str, task: Task | str, spec: ScheduleSpec) -> Schedule:
        """Declare schedule ``name`` of ``task`` as ``spec`` says (``App.add_schedule``)."""
        ...

@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call overrides of a task's defaults (see ``Task.configure``)."""

    delay: float | None = None
    at: datetime | None = None
    queue: str | None = None
    priority: int | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    unique_key: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    session: Any = None
    concurrency_key: str | None = None
    max_concurrency: int | None = None


def _aware(moment: datetime | None) -> datetime | None:
    """A naive datetime is taken as UTC, not as the database session's time zone."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


# One cursor kept per pooled connection: creating a cursor per enqueue (an adapters map, a
# transformer) cost about a tenth of a single enqueue's client CPU. A cursor is used only by the
# thread that has its connection checked out. The entries of closed connections are dropped
# whenever a cursor is added (a closed connection is replaced by a new one, which adds one).
_cursors: dict[psycopg.Connection[Any], psycopg.Cursor[Any]] = {}
_cursors_lock = threading.Lock()


def _cursor_for(connection: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    cursor = _cursors.get(connection)
    if cursor is None:
        cursor = connection.cursor()
        with _cursors_lock:
            for closed in [known for known in _cursors if known.closed]:
                del _cursors[closed]
            _cursors[connection] = cursor
    return cursor


#: What a connection lost after sending an insert leaves unknown (``ConnectionLost``).
_UNSURE_ONE = "the job may or may not have been enqueued"
_UNSURE_MANY = "the jobs may or may not have been enqueued (all of them or none)"


def _insert_pooled(app: TaskHost, params: dict[str, Any]) -> int:
    """Insert one job on the app's single-call connection, or a pooled one while another
    thread uses it (autocommit: one statement, one transaction; see
    ``Connections.run_single``), through the cursor kept for that connection; its notice
    limited per process (akadze_core.store.notices)."""
    connections = app.connections
    return connections.run_single(
        lambda connection: database.insert_job_limited(_cursor_for(connection), params,
                                                       connections.notices),
        _UNSURE_ONE)


class CallCheck:
    """Whether a job's arguments can ever be passed to the task's function.

    A job's args are the function's keyword arguments (``func(**args)``), so a missing
    required argument or an unknown one fails every attempt of the job at the worker. Checked
    at enqueue instead, as Celery's ``.delay()`` checks a call against the signature: the
    usual call costs two set comparisons of its keys; only a call that fails them is bound
    with ``inspect.Signature.bind`` for its exact ``TypeError``.
    """

    __slots__ = ("_accepts_any", "_allowed", "_name", "_required", "_signature",
                 "takes_anything")

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        self._name = name
        try:
            signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # a builtin or callable object without one
            signature = None
        self._signature = signature
        parameters = signature.parameters.values() if signature is not None else ()
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._allowed = frozenset(p.name for p in parameters if p.kind in keyword)
        # A positional-only parameter without a default can never be given by name: no
        # keyword arguments satisfy it, and bind() says so.
        self._required = frozenset(
            p.name for p in parameters
            if p.default is inspect.Parameter.empty and p.kind in (
                *keyword, inspect.Parameter.POSITIONAL_ONLY))
        self._accepts_any = signature is None or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
        #: Whether any keyword arguments bind (``**kwargs`` and nothing required): then no
        #: call needs checking.
        self.takes_anything = self._accepts_any and not self._required

    def __call__(self, kwargs: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` (naming the task) if ``func(**kwargs)`` can never bind."""
        keys = kwargs.keys()
        if keys >= self._required and (self._accepts_any or keys <= self._allowed):
            return
        assert self._signature is not None  # a signature-less function accepts anything
        try:
            self._signature.bind(**kwargs)
        except TypeError as exc:
            raise TypeError(f"task {self._name!r} cannot take these arguments: {exc}") from None


class TaskCall:
    """A task with enqueue options applied; made by ``Task.configure`` and ``Task.using``."""

    def __init__(self, task: Task, options: EnqueueOptions) -> None:
        self.task = task
        self.options = options
        # The options are frozen, so their meta is encoded once, at the first enqueue (a
        # call kept and reused, like the facade's plain .delay(), pays for it once).
        self._meta_text: str | None = None
        # That text without its closing brace, ready for a per-call task id (see
        # enqueue_with_task_id), and its size in bytes.
        self._meta_head: tuple[str, int] | None = None
        # The insert's parameters but the args, with the task defaults they were resolved
        # from (see _insert_params).
        self._fixed: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def configure(
        self,
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
        concurrency_key: str | None = None,
        max_concurrency: int | None = None,
    ) -> TaskCall:
        """Override when (``delay`` or ``at``), where and how the next enqueue runs.

        ``unique_key``: while a job with this key is queued or running, enqueue returns its
        id instead of inserting a duplicate. ``meta`` is encoded at the first enqueue of the
        returned call: change it by configuring again, not by changing the mapping.
        ``concurrency_key`` / ``max_concurrency``: at most that many jobs with this key run at
        once across the fleet (the task's own when not given; docs/how-to/limits.md).
        """
        if delay is not None and at is not None:
            raise ValueError("give either delay or at, not both")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (it includes the first run)")
        if concurrency_key is not None or max_concurrency is not None:
            check_concurrency(concurrency_key or self.task.concurrency_key, max_concurrency)
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        given: dict[str, Any] = {
            "queue": queue, "priority": priority, "expires_at": expires_at,
            "max_attempts": max_attempts, "unique_key": unique_key, "meta": meta,
            "concurrency_key": concurrency_key, "max_concurrency": max_concurrency,
        }
        changes = {key: value for key, value in given.items() if value is not None}
        if delay is not None or at is not None:
            # One replaces the other, so a later configure(at=...) beats an earlier delay.
            changes.update(delay=seconds, at=at)
        return TaskCall(self.task, replace(self.options, **changes))

    def using(self, *, session: psycopg.Connection | psycopg.AsyncConnection) -> TaskCall:
        """Enqueue on ``session`` (a psycopg connection), inside its current transaction.

        The job commits or rolls back with the caller's transaction. With a sync connection
        ``enqueue`` returns the id; with an async one it returns an awaitable of the id.
        """
        return TaskCall(self.task, replace(self.options, session=session))

    def _meta(self) -> str:
        """The options' meta, encoded and validated like args (once per TaskCall)."""
        if self._meta_text is None:
            meta = self._concurrency_meta(self.options.meta)
            if not meta:  # the usual case; jsonb stores any encoding of {} the same way
                self._meta_text = "{}"
            else:
                app = self.task.app
                self._meta_text = encode_fast(meta, app.json_dumps, app.max_args_bytes)
        return self._meta_text

    def _concurrency_meta(self, meta: Mapping[str, Any]) -> Mapping[str, Any]:
        """``meta`` with the call's (else the task's) concurrency key and max, where the
        limited claim reads them (akadze.claim_jobs_limited)."""
        options, task = self.options, self.task
        key = options.concurrency_key or task.concurrency_key
        if key is None:
            return meta
        if dialect() == "citus":
            # Citus mode claims without the limited claim: a key would not hold, so refuse.
            raise psycopg.errors.FeatureNotSupported(
                "concurrency_key is not available in Citus mode (see docs/how-to/citus.md)")
        most = options.max_concurrency or task.max_concurrency or 1
        return {**meta, "concurrency_key": key, "max_concurrency": most}

    def _meta_with_task_id(self, task_id: str) -> str:
        """The options' meta with ``"task_id": task_id`` added, spliced into the text
        encoded once (``_meta``) rather than encoded again per call. Added last, so it
        replaces a ``task_id`` the options' meta holds (jsonb keeps the last of duplicate
        keys). Raises ``InvalidArgs`` as ``encode_args`` would for the whole meta."""
        app = self.task.app
        head = self._meta_head
        if head is None:
            body = self._meta().strip()[:-1].rstrip()  # an encoded object, but its "}"
            text = body + ('"task_id":' if body == "{" else ',"task_id":')
            head = self._meta_head = (text, len(text.encode("utf-8")))
        if type(task_id) is not str:
            raise InvalidArgs(f"a task id must be a str, not {type(task_id).__name__}")
        if len(task_id) > MAX_NAME_LENGTH:  # it is indexed (jobs_meta_task_id_idx)
            check_name(task_id, "a task id", key=True)
        limit = app.max_args_bytes
        if not storable(task_id, limit):  # NUL, a lone surrogate or too long: its error
            encode_args({"task_id": task_id}, app.json_dumps, limit)
        value = encode_basestring_ascii(task_id)  # ASCII: as many bytes as characters
        if head[1] + len(value) + 1 > limit:
            raise InvalidArgs(f"job meta is {head[1] + len(value) + 1} bytes, over the "
                              f"limit of {limit} bytes")
        return head[0] + value + "}"

    def _insert_params(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The bound parameters of the insert (``JobRequest``'s fields; ``unique_key`` only
        when set, as it selects the conflict-handling insert). Single enqueue binds these
        straight, without the request object: it is bound by its client-side cost.

        All but the args depend only on the frozen options and on the task's defaults, so
        they are resolved once and copied per call, again whenever a default changed."""
        task = self.task
        app = task.app
        defaults = (task.name, task.queue, task.priority, task.max_attempts)
        fixed = self._fixed
        if fixed is None or fixed[0] != defaults:
            fixed = self._fixed = (defaults, self._fixed_params())
        check = task.check_call
        if not check.takes_anything:  # the Celery facade's tasks take any keywords
            check(kwargs)
        params = fixed[1].copy()
        params["args"] = encode_fast(kwargs, app.json_dumps, app.max_args_bytes)
        return params

    def _fixed_params(self) -> dict[str, Any]:
        task, options = self.task, self.options
        # Checked here, once per call object and task defaults (see _insert_params): a name
        # Postgres cannot index or notify would otherwise fail the insert with a raw error.
        check_name(task.name, "a task name")
        check_name(options.queue or task.queue, "a queue name")
        check_name(options.unique_key, "a unique key", key=True)
        params = {
            "task": task.name, "queue": options.queue or task.queue, "args": None,
            "priority": task.priority if options.priority is None else options.priority,
            "scheduled_at": _aware(options.at), "delay": options.delay or 0.0,
            "max_attempts": options.max_attempts or task.max_attempts,
            "expires_at": _aware(options.expires_at), "meta": self._meta(),
        }
        if options.unique_key is not None:
            params["unique_key"] = options.unique_key
        return params

    def encode_args(self, kwargs: Mapping[str, Any]) -> str:
        """Check ``kwargs`` against the task's function and encode them as a job's args
        (raises ``TypeError`` or ``InvalidArgs``)."""
        self.task.check_call(kwargs)
        app = self.task.app
        return encode_fast(kwargs, app.json_dumps, app.max_args_bytes)

    def request(self, kwargs: Mapping[str, Any], provided: Iterable[str] = (), *,
                check: bool = True) -> JobRequest:
        """Validate ``kwargs`` and build the row to insert (raises ``InvalidArgs``, or
        ``TypeError`` for a call the task's function can never accept). ``provided``: names
        of arguments the worker adds at run time (a workflow's ``result_arg``), checked as
        given but not stored."""
        extra = tuple(provided)
        if not check:  # a template whose args the caller encodes (Workflow.add_many)
            params = self._fixed_params()
            params["args"] = "{}"
            return JobRequest(**params)
        if not extra:
            return JobRequest(**self._insert_params(kwargs))
        clash = [name for name in extra if name in kwargs]
        if clash:
            raise TypeError(f"{clash[0]!r} is given and is also the argument the upstream "
                            "results go to")
        self.task.check_call({**kwargs, **dict.fromkeys(extra)})
        app = self.task.app
        params = self._fixed_params()
        params["args"] = encode_fast(kwargs, app.json_dumps, app.max_args_bytes)
        return JobRequest(**params)

    def _fixed_request_params(self) -> dict[str, Any]:
        """``_insert_params`` without any args (``{}``) and without checking the call: the
        row template of a bulk insert, whose jobs are checked one by one."""
        params = self._fixed_params()
        params["args"] = "{}"
        return params

    def requests(self, kwargs_list: Iterable[Mapping[str, Any]]) -> tuple[JobRequest, list[str]]:
        """The bulk form of ``request``: one row template (the options, resolved and encoded
        once) and every job's validated args, as the JSON arrays of ``encode_many`` (the bulk
        path's hot loop)."""
        template, items = self._checked(kwargs_list)
        app = self.task.app
        return template, encode_many(items, app.json_dumps, app.max_args_bytes)

    def _checked(self, kwargs_list: Iterable[Mapping[str, Any]]) \
            -> tuple[JobRequest, list[Mapping[str, Any]]]:
        """The bulk paths' row template, and every call's kwargs, each checked against the
        task's signature (TypeError for the first that does not fit)."""
        template = JobRequest(**self._fixed_request_params())
        items = kwargs_list if isinstance(kwargs_list, list) else list(kwargs_list)
        check = self.task.check_call
        if not check.takes_anything:  # the Celery facade's tasks: a step per job saved
            for kwargs in items:
                check(kwargs)
        return template, items

    def rows(self, kwargs_list: Iterable[Mapping[str, Any]],
             metas: Iterable[Mapping[str, Any]] | None = None, *,
             meta_texts: Iterable[str] | None = None,
             first_position: int | None = None, deferred: bool = False) -> Rows:
        """``requests`` for a workflow (``Workflow.add_many``): every call checked, then every
        job's args (and, with ``metas``, its own meta, in place of the options' meta) encoded
        in JSON arrays of up to ``BULK_CHUNK`` jobs, a job being its args object or, with
        ``metas``, ``[args, meta]``. Raises ``TypeError`` or ``InvalidArgs`` for the first bad
        job, as ``enqueue_many`` does. ``meta_texts``: instead of ``metas``, each job's meta
        as the JSON text of an object, encoded already (an integration splicing per-job ids
        into one encoded meta); spliced in unparsed, so a text that is not JSON makes the
        insert fail, with nothing inserted. ``first_position``: each job's ``position`` (the
        column, ``Job.position``: its index in a fan-out, a Celery group member's
        ``group_index``) is this, then one more per job, and every job has the call's meta
        (nothing per job to encode, send or parse but its args and a number).
        ``deferred``: the arrays are encoded when first read (``Rows``), ``InvalidArgs``
        raised then: the jobs' arguments must not change until then."""
        if sum(given is not None for given in (metas, meta_texts, first_position)) > 1:
            raise ValueError("give one of metas, meta_texts and first_position")
        template, items = self._checked(kwargs_list)
        app = self.task.app
        dumps, limit = app.json_dumps, app.max_args_bytes
        count = len(items)
        encode: Callable[[int], Chunk]
        if first_position is not None:
            if type(first_position) is not int:
                raise TypeError(f"first_position is an int, not {first_position!r}")
            if first_position < POSITIONS.start or first_position + count > POSITIONS.stop:
                raise ValueError(f"positions from {first_position} for {count} jobs do "
                                 "not fit the position column (a Postgres integer)")
            first = first_position

            def encode(index: int) -> Chunk:
                start = index * BULK_CHUNK
                args_text, each = encode_chunk_items(items[start:start + BULK_CHUNK], dumps,
                                                      limit)
                return f'{{"args":{args_text},"index":{first + start}}}', each

            return Rows(template, count, False, encode, first_position=first_position,
                        deferred=deferred)
        if meta_texts is not None:
            texts = checked_meta_texts(meta_texts, count, limit)

            def encode(index: int) -> Chunk:
                start = index * BULK_CHUNK
                return encode_split(items[start:start + BULK_CHUNK],
                                    texts[start:start + BULK_CHUNK], dumps, limit)

            return Rows(template, count, True, encode, deferred=deferred)
        if metas is None:
            def encode(index: int) -> Chunk:
                start = index * BULK_CHUNK
                return encode_chunk_items(items[start:start + BULK_CHUNK], dumps, limit)
        else:
            own = metas if isinstance(metas, list) else list(metas)
            if len(own) != count:
                raise ValueError(f"{len(own)} metas for {count} jobs")

            def encode(index: int) -> Chunk:
                start = index * BULK_CHUNK
                return encode_pairs(items[start:start + BULK_CHUNK],
                                    own[start:start + BULK_CHUNK], dumps, limit)

        return Rows(template, count, metas is not None, encode, deferred=deferred)

    def enqueue(self, **kwargs: Any) -> Any:
        """Insert a job; returns its id (an awaitable of it when using an async session).

        Raises ``InvalidArgs`` for arguments that cannot be stored, ``TypeError`` for a call
        the registered function can never accept, ``SchemaMissing`` when the database has
        no akadze schema; nothing is inserted then."""
        return self._enqueue(self._insert_params(kwargs))

    def enqueue_with_task_id(self, task_id: str, /, **kwargs: Any) -> Any:
        """``enqueue``, with ``task_id`` as the job's ``meta["task_id"]``: the external id
        ``App.find_job`` looks jobs up by (the Celery facade's task ids). Cheap per call:
        the id is spliced into the meta encoded once for this TaskCall, so a call kept and
        reused gives every job its own id without encoding its meta again."""
        params = self._insert_params(kwargs)
        params["meta"] = self._meta_with_task_id(task_id)
        return self._enqueue(params)

    def _enqueue(self, params: dict[str, Any]) -> Any:
        session = self.options.session
        try:
            if session is None:
                return _insert_pooled(self.task.app, params)
            if isinstance(session, psycopg.AsyncConnection):
                return self._schema_checked(database.insert_job_params_async(session, params))
            return database.insert_job_params(session, params)
        except SCHEMA_ERRORS as exc:
            raise self._schema_missing() from exc

    async def enqueue_async(self, **kwargs: Any) -> int:
        """Async insert of one job; returns its id."""
        params = self._insert_params(kwargs)
        session = self.options.session
        if session is not None:
            if not isinstance(session, psycopg.AsyncConnection):
                raise TypeError("enqueue_async needs an async session; use enqueue()")
            return await self._schema_checked(database.insert_job_params_async(session, params))
        connections = self.task.app.connections
        return int(await self._schema_checked(connections.run_pooled_async(
            lambda connection: database.insert_job_limited_async(connection, params,
                                                                 connections.notices),
            _UNSURE_ONE)))

    def enqueue_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> Any:
        """Insert many jobs in one statement; returns their ids in input order.

        Every job is validated first: one bad argument set inserts nothing.
        """
        template, args = self.requests(kwargs_list)
        session = self.options.session
        try:
            if isinstance(session, psycopg.AsyncConnection):
                return self._schema_checked(database.insert_jobs_async(session, template, args))
            if session is not None:
                return database.insert_jobs(session, template, args)
            return self.task.app.connections.run_pooled(
                lambda connection: database.insert_jobs(connection, template, args),
                _UNSURE_MANY)
        except SCHEMA_ERRORS as exc:
            raise self._schema_missing() from exc

    async def enqueue_many_async(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Async twin of ``enqueue_many``."""
        template, args = self.requests(kwargs_list)
        session = self.options.session
        if session is not None:
            if not isinstance(session, psycopg.AsyncConnection):
                raise TypeError("enqueue_many_async needs an async session; use enqueue_many()")
            return await self._schema_checked(database.insert_jobs_async(session, template, args))
        return list(await self._schema_checked(self.task.app.connections.run_pooled_async(
            lambda connection: database.insert_jobs_async(connection, template, args),
            _UNSURE_MANY)))

    def _schema_missing(self) -> SchemaMissing:
        """The error an enqueue raises instead of psycopg's UndefinedTable: one line naming
        the command that applies the schema, no SQL text."""
        return schema_missing(command=self.task.app.migrate_command)

    async def _schema_checked(self, insert: Awaitable[T]) -> T:
        """``await insert``, with a missing schema raised as ``SchemaMissing``."""
        try:
            return await insert
        except SCHEMA_ERRORS as exc:
            raise self._schema_missing() from exc


class Task(TaskCall):
    """A registered function plus its defaults. Calling it runs the function directly."""

    def __init__(
        self,
        app: TaskHost,
        name: str,
        func: Callable[..., Any],
        *,
        queue: str,
        max_attempts: int = 3,
        timeout: float | None = None,
        backoff: BackoffPolicy | None = None,
        priority: int = 0,
        rate_limit: str | float | None = None,
        concurrency_key: str | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        check_concurrency(concurrency_key, max_concurrency)
        #: ``rate_limit`` parsed (None: no limit declared).
        self.rate: Rate | None = None
        self.rate_limit = rate_limit
        #: Default per-key concurrency of its jobs (``configure`` overrides per call).
        self.concurrency_key = concurrency_key
        self.max_concurrency = max_concurrency
        super().__init__(self, EnqueueOptions())
        self.app = app
        self.name = name
        self.func = func
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff = backoff
        self.priority = priority
        self.is_async = inspect.iscoroutinefunction(func)
        #: Raises ``TypeError`` for job arguments ``func`` can never take (see CallCheck).
        self.check_call = CallCheck(name, func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    @property
    def rate_limit(self) -> str | float | None:
        """The task's global rate limit as given ("100/s", "10/m", "1000/h"), which every
        worker that starts with this task sets in the database (``App.set_rate_limit``
        changes it at run time). Setting it checks it (``ValueError``)."""
        return self._rate_limit

    @rate_limit.setter
    def rate_limit(self, value: str | float | None) -> None:
        self.rate = parse_rate(value)
        self._rate_limit = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def schedule(
        self,
        name: str | None = None,
        *,
        trigger: Trigger | str,
        args: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: timedelta | float | None = None,
        meta: Mapping[str, Any] | None = None,
        task_ids: bool = False,
    ) -> Schedule:
        """Run this task at every tick of ``trigger``: ``App.add_schedule`` with the task's
        name as the schedule's name unless ``name`` is given."""
        return self.app.declare_schedule(name or self.name, self, ScheduleSpec(
            trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta, task_ids=task_ids))

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"
