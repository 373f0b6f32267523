"""The ``Celery`` application: configuration, the task registry, and the akadze_core app.

``Celery(...)`` keeps Celery's signature. Its ``core`` is an ``akadze_core.App`` made on
first use from ``broker_url`` (a Postgres URL; none at all means ``AKADZE_DATABASE_URL``,
else the embedded Postgres). Every Celery task is registered on it under the same name.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from akadze_core import App as CoreApp

from .. import _state, beat, django_beat, serialization, signals
from ..backends import django_results
from ..backends.database import DatabaseBackend
from ..canvas import Signature, signature
from ..exceptions import ImproperlyConfigured
from ..loaders import Loader, django_app_names
from ..result import AsyncResult, GroupResult
from ..worker import entry as worker_entry
from ..worker.entry import core_timeout, make_entry
from . import builtins, command, publish  # noqa: F401  # builtins: celery.map/starmap on every app
from . import report as _report
from . import routes as routing
from .amqp import AMQP
from .annotations import prepare as prepare_annotations
from .config import Settings, database_url, import_object, load_source, retention
from .control import Control
from .registry import TaskRegistry, gen_task_name, register_task, shared_task, task_from_fun
from .task import Task as _Task

__all__ = ["Celery", "database_url", "gen_task_name", "shared_task"]

logger = logging.getLogger("akadze_compat.app")


def _worker_hostname() -> str:
    """The name of the worker in this process (``-n``), as ``request.hostname`` has it."""
    return worker_entry.worker_hostname

class Celery:
    """A Celery application (``Celery(main=None, broker=None, ..., **config)``)."""

    task_cls: Any = "akadze_compat.app.task:Task"

    def __init__(self, main: str | None = None, loader: Any = None, backend: Any = None,
                 amqp: Any = None, events: Any = None, log: Any = None, control: Any = None,
                 set_as_current: bool = True, tasks: Any = None, broker: str | None = None,
                 include: Any = None, changes: dict[str, Any] | None = None,
                 config_source: Any = None, fixups: Any = None, task_cls: Any = None,
                 autofinalize: bool = True, namespace: str | None = None,
                 strict_typing: bool = True, config_source_silent: bool = False,
                 **kwargs: Any) -> None:
        self.main = main
        self.task_cls = task_cls or self.task_cls
        self.set_as_current = set_as_current
        self.autofinalize = autofinalize
        self.namespace = namespace
        self.strict_typing = strict_typing
        self.configured = False
        self.finalized = False
        self._config_source = config_source
        self._config_source_silent = config_source_silent
        self._finalize_lock = threading.RLock()
        self._core_lock = threading.Lock()
        self._core: CoreApp | None = None
        self._tasks = TaskRegistry(tasks or {})
        self._pending_defaults: list[Callable[[], Any]] = []
        self._pending_autodiscovery: list[tuple[Any, str | None]] = []
        self._router_cache: tuple[Any, routing.Router] | None = None
        #: add_periodic_task calls made before the configuration was loaded (``beat``'s
        #: bookkeeping, kept on the app it is about).
        self.pending_periodic_tasks: list[tuple[str, dict[str, Any], str | None]] = []
        #: beat_schedule entries declared on the core app, by name (``beat``'s bookkeeping).
        self.declared_schedules: dict[str, str] = {}
        preconf = dict(changes or {})
        for key, value in (("broker_url", broker), ("result_backend", backend),
                           ("include", include), *kwargs.items()):
            if value is not None:
                preconf[key] = value
        self._conf = Settings(preconf, namespace=namespace, on_first_read=self._load_config)
        self.on_configure = signals.Signal(name="app.on_configure")
        self.on_after_configure = signals.Signal(name="app.on_after_configure",
                                                 providing_args={"source"})
        self.on_after_finalize = signals.Signal(name="app.on_after_finalize")
        self.on_after_fork = signals.Signal(name="app.on_after_fork")
        self.loader = Loader(self)
        self.control = Control(self)
        if set_as_current:
            self.set_current()
        _state.register_app(self)
        self.on_init()

    def on_init(self) -> None:
        """Called at the end of ``__init__`` (override in a subclass)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.main or '__main__'} at {id(self):#x}>"

    def __enter__(self) -> Celery:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def set_current(self) -> None:
        """Make this the current app."""
        _state.set_current_app(self)

    def set_default(self) -> None:
        """Make this the default app (the current one when none was made current)."""
        _state.set_default_app(self)

    def close(self) -> None:
        """Close the database pools and forget this app."""
        core = self._core
        if core is not None:
            core.close()
        _state.unregister_app(self)

    def bugreport(self) -> str:
        """Celery's bug-report text: versions, platform, loader, then the changed settings
        (secrets masked)."""
        return _report.bugreport(self)

    # --- configuration -----------------------------------------------------------------------

    @property
    def config_source(self) -> Any:
        """What the settings are read from: the last ``config_from_object`` argument (an
        object, a dict or a ``"module"`` / ``"module:attr"`` name), or ``config_source=``."""
        return self._config_source

    @property
    def conf(self) -> Settings:
        """The settings (loaded on first read)."""
        return self._conf

    @conf.setter
    def conf(self, settings: Settings) -> None:
        self._conf = settings

    def _load_config(self) -> None:
        self.on_configure.send(sender=self)
        source = load_source(self._config_source, self._config_source_silent)
        self._conf.set_source(source)
        self.configured = True
        while self._pending_defaults:
            self._conf.add_defaults(self._pending_defaults.pop(0)())
        beat.add_pending_periodic_tasks(self)
        self.on_after_configure.send(sender=self, source=self._conf)

    def config_from_object(self, obj: Any, silent: bool = False, force: bool = False,
                           namespace: str | None = None) -> Settings | None:
        """Read settings from an object, a dict, or ``"module"``/``"module:attr"`` (imported
        on first use). ``namespace="CELERY"`` reads ``CELERY_``-prefixed names."""
        self._config_source = obj
        self._config_source_silent = silent
        self.namespace = namespace or self.namespace
        self._conf.set_namespace(self.namespace)
        if force or self.configured:
            self._conf.set_source(load_source(obj, silent))
            return self._conf
        return None

    def config_from_envvar(self, variable_name: str, silent: bool = False,
                           force: bool = False) -> Settings | None:
        """``config_from_object(os.environ[variable_name])``."""
        module_name = os.environ.get(variable_name)
        if not module_name:
            if silent:
                return None
            raise ImproperlyConfigured(f"The environment variable {variable_name!r} is not set, "
                                       "and has to be set to a configuration module")
        return self.config_from_object(module_name, silent=silent, force=force)

    def config_from_cmdline(self, argv: list[str], namespace: str = "celery") -> dict[str, Any]:
        """Settings from ``key=value`` words (values kept as text)."""
        values = dict(word.split("=", 1) for word in argv if "=" in word)
        self.conf.update(values)
        return values

    def add_defaults(self, defaults: Any) -> None:
        """Add default settings (a mapping, or a function returning one, called lazily)."""
        factory = defaults if callable(defaults) else (lambda: defaults)
        if self.configured:
            self._conf.add_defaults(factory())
        else:
            self._pending_defaults.append(factory)

    @property
    def timezone(self) -> tzinfo:
        """``timezone`` (or Django's TIME_ZONE); UTC by default (local when not enable_utc)."""
        name = self.conf.timezone
        if name:
            return name if isinstance(name, tzinfo) else ZoneInfo(str(name))
        if self.conf.enable_utc:
            return timezone.utc
        local = datetime.now().astimezone().tzinfo
        return local or timezone.utc

    def now(self) -> datetime:
        """The current time in the app's timezone."""
        return datetime.now(self.timezone)

    def uses_utc_timezone(self) -> bool:
        """Whether the app's timezone is UTC."""
        return self.timezone in (timezone.utc, ZoneInfo("UTC"))

    # --- the akadze_core app ------------------------------------------------------------------

    @property
    def core(self) -> CoreApp:
        """The ``akadze_core.App`` behind this app (made on first use)."""
        core = self._core
        if core is not None:
            return core
        # Load the configuration first, outside the lock: on_after_configure receivers may
        # use the app.
        self._conf.finalize()
        with self._core_lock:
            if self._core is None:
                self._core = self._make_core()
                for task in list(self._tasks.values()):
                    self.register_core_task(task)
            return self._core

    def _make_core(self) -> CoreApp:
        conf = self.conf
        url = database_url(conf.broker_url)
        serialization.check_serializer(conf.task_serializer, "task_serializer")
        serialization.check_accept_content(conf.accept_content)
        if conf.result_backend and not django_results.wanted(self):
            logger.info("result_backend=%r is ignored: results live in the same Postgres "
                        "database as the queue", str(conf.result_backend).split("://")[0])
        expires = conf.result_expires
        failure_expires = conf.result_failure_expires
        core = CoreApp(url, default_queue=conf.task_default_queue or "celery",
                       succeeded_retention=retention(expires),
                       failed_retention=retention(failure_expires) if failure_expires
                       else timedelta(days=7),
                       json_dumps=serialization.dumps, json_loads=serialization.loads)
        # A .delay() on a database without the schema names this facade's command, with the
        # app's module when it has a real one (Celery("tasks") -> -A tasks).
        project = self.main if self.main and self.main != "__main__" else "PROJECT"
        core.migrate_command = f"akadze-compat -A {project} migrate"
        # django-db: django_celery_results' rows, written with each outcome wherever it is
        # stored (the worker's batches, a prefork child's own write before task_postrun).
        django_results.register(self, core, _worker_hostname)
        return core

    def register_core_task(self, task: _Task) -> None:
        """Register ``task`` on the core app under its name, with the entry a worker runs
        (``worker.entry.make_entry``); nothing until the core app is made (``core`` then
        registers every task), nor for a name registered already."""
        core = self._core
        if core is None or task.name in core.tasks:
            return
        core.task(task.name, queue=self.conf.task_default_queue or "celery",
                  timeout=core_timeout(task))(make_entry(self, str(task.name)))

    def prepare_worker(self) -> CoreApp:
        """Import the task modules, finalize, declare the periodic tasks (``beat_schedule``)
        on the core app, and return it for a Worker to run. Safe to call again."""
        self.loader.import_default_modules()
        self.finalize()
        # As Celery's worker does: ``include`` gains the modules of the registered tasks
        # (inspect's conf() shows it).
        modules = {type(task).__module__ for task in self.tasks.values()}
        included = self.conf.include or ()
        included = (included,) if isinstance(included, str) else tuple(included)
        if not modules <= set(included):
            self.conf.include = tuple(set(included) | modules)
        core = self.core
        # Celery's rate_limit (the task's own, its annotations', task_default_rate_limit):
        # in akadze one global limit, which the worker sets in the database as it starts.
        for name, task in list(self.tasks.items()):
            core_task = core.tasks.get(name)
            if core_task is not None:
                core_task.rate_limit = task.rate_limit or None
        beat.register_periodic_tasks(self, core)
        django_beat.register(self, core)
        django_results.register(self, core, _worker_hostname)
        return core

    def start(self, argv: list[str] | None = None) -> None:
        """Run the ``akadze-compat`` command line for this app, as Celery's ``app.start``
        runs ``celery``: ``app.start(["worker", "-l", "INFO"])`` runs it to its end (a
        failure raises ``SystemExit`` with its code); in a script's ``if __name__ ==
        "__main__": app.start()`` the process becomes the command, with the script's
        arguments (``python tasks.py worker``). See ``akadze_compat.app.command``."""
        command.start(self, argv)

    def worker_main(self, argv: list[str] | None = None) -> None:
        """Run ``akadze-compat worker`` for this app: ``argv`` (default: the script's
        arguments) must name the ``worker`` command, as Celery requires."""
        if "worker" not in (sys.argv if argv is None else argv):
            raise ValueError("The worker sub-command must be specified in argv. "
                             "Use app.start() to programmatically start other commands.")
        command.start(self, argv)

    def add_periodic_task(self, schedule: Any, sig: Any, args: Any = (), kwargs: Any = (),
                          name: str | None = None, **opts: Any) -> str:
        """Run ``sig`` (a signature or a task) on ``schedule`` (seconds, timedelta,
        ``schedule``, ``crontab``): an entry in ``beat_schedule`` under ``name``, else the
        signature's repr. Returns the entry's key. Every worker schedules it (no beat)."""
        return beat.add_periodic_task(self, schedule, sig, args, kwargs, name, **opts)

    def signature(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature bound to this app (``app.signature("proj.add", (2, 2))``)."""
        kwargs["app"] = self
        return signature(*args, **kwargs)

    def router(self) -> routing.Router:
        """The task router for the current settings."""
        conf = self.conf
        routes = conf.task_routes
        cached = self._router_cache
        if cached is None or cached[0] is not routes:
            cached = self._router_cache = (routes, routing.Router(routing.prepare(routes)))
        router = cached[1]
        router.queues = routing.queue_names(conf.task_queues)
        router.default_queue = conf.task_default_queue or "celery"
        router.create_missing = bool(conf.task_create_missing_queues)
        return router

    # --- tasks -------------------------------------------------------------------------------

    @property
    def Task(self) -> type[_Task]:
        """The base task class of this app (``task_cls``, bound to the app)."""
        cls = self.__dict__.get("_task_base")
        if cls is None:
            base = import_object(self.task_cls) if isinstance(self.task_cls, str) \
                else self.task_cls
            cls = type(base.__name__, (base,), {"_app": self, "__module__": base.__module__,
                                                "abstract": True})
            self.__dict__["_task_base"] = cls
        return cls

    @property
    def steps(self) -> defaultdict[str, set[Any]]:
        """Custom boot steps: ``app.steps["worker"].add(MyStep)`` (``celery.bootsteps``);
        ``akadze-compat worker`` runs them."""
        steps = self.__dict__.get("_steps")
        if steps is None:
            steps = self.__dict__["_steps"] = defaultdict(set)
        return steps

    @steps.setter
    def steps(self, value: defaultdict[str, set[Any]]) -> None:
        self.__dict__["_steps"] = value

    @property
    def annotations(self) -> list[Any]:
        """``task_annotations``, prepared (``celery.app.annotations``): read once, when the
        first task is bound."""
        prepared = self.__dict__.get("_annotations")
        if prepared is None:
            prepared = self.__dict__["_annotations"] = prepare_annotations(
                self.conf.get("task_annotations"))
        return prepared

    @property
    def tasks(self) -> TaskRegistry:
        """Task name -> task (finalizes the app)."""
        self.finalize(auto=True)
        return self._tasks

    @property
    def registry(self) -> TaskRegistry:
        """Task name -> task as registered so far, without finalizing the app (``tasks``
        finalizes first): what registering a task, the worker's entries, beat and results
        read and write."""
        return self._tasks

    def task(self, *args: Any, **options: Any) -> Any:
        """Make a task of a function: ``@app.task`` or ``@app.task(name=..., bind=True, ...)``.

        Options become task attributes (``max_retries``, ``autoretry_for``, ...).
        """
        options.pop("shared", None)
        options.pop("lazy", None)
        task_filter = options.pop("filter", None)

        def create(fun: Callable[..., Any]) -> Any:
            task = self._task_from_fun(fun, **options)
            return task_filter(task) if task_filter else task

        if len(args) == 1:
            if callable(args[0]):
                return create(args[0])
            raise TypeError("argument 1 to @task() must be a callable")
        if args:
            raise TypeError(f"@task() takes exactly 1 argument ({len(args) + len(options)} "
                            "given)")
        return create

    def _task_from_fun(self, fun: Callable[..., Any], **options: Any) -> _Task:
        return task_from_fun(self, fun, **options)

    def register_task(self, task: _Task | type[_Task], **options: Any) -> _Task:
        """Register a class-based task (an instance or the class)."""
        return register_task(self, task, **options)

    def gen_task_name(self, name: str, module: str | None) -> str:
        """The default name of a task made from ``module.name``."""
        return gen_task_name(self, name, module)

    def finalize(self, auto: bool = False) -> None:
        """Create the shared tasks on this app and bind every task to its settings."""
        with self._finalize_lock:
            if self.finalized:
                return
            if auto and not self.autofinalize:
                raise RuntimeError("Contract breach: app not finalized")
            self.finalized = True
            for callback in _state.finalize_callbacks():
                callback(self)
            for task in list(self._tasks.values()):
                type(task).bind(self)
            self.on_after_finalize.send(sender=self)

    def autodiscover_tasks(self, packages: Any = None, related_name: str | None = "tasks",
                           force: bool = False) -> list[Any] | None:
        """Import ``<package>.tasks`` of each package (Django's INSTALLED_APPS when None;
        ``packages`` may be a callable). Done when the worker starts, or now with ``force``."""
        if force:
            return self._autodiscover(packages, related_name)
        self._pending_autodiscovery.append((packages, related_name))
        return None

    def _autodiscover(self, packages: Any, related_name: str | None) -> list[Any]:
        names = packages() if callable(packages) else packages
        if not names:
            names = django_app_names()
        return self.loader.autodiscover_tasks(list(names), related_name)

    def run_pending_autodiscovery(self) -> list[Any]:
        """Import the task modules of every ``autodiscover_tasks`` call made without
        ``force`` (the loader does it when the worker starts); returns the modules."""
        modules: list[Any] = []
        while self._pending_autodiscovery:
            packages, related_name = self._pending_autodiscovery.pop(0)
            modules.extend(self._autodiscover(packages, related_name))
        return modules

    # --- calling and results ------------------------------------------------------------------

    def send_task(self, name: str, args: Any = None, kwargs: Any = None,
                  countdown: float | None = None, eta: Any = None, task_id: str | None = None,
                  producer: Any = None, connection: Any = None, router: Any = None,
                  result_cls: Any = None, expires: Any = None, publisher: Any = None,
                  link: Any = None, link_error: Any = None, add_to_parent: bool = True,
                  group_id: Any = None, group_index: Any = None, retries: int = 0,
                  chord: Any = None, reply_to: Any = None, time_limit: float | None = None,
                  soft_time_limit: float | None = None, root_id: str | None = None,
                  parent_id: str | None = None, route_name: str | None = None,
                  shadow: str | None = None, chain: Any = None, task_type: Any = None,
                  **options: Any) -> AsyncResult:
        """Enqueue the task called ``name`` (it need not be registered here)."""
        return publish.send_task(
            self, name, args, kwargs, countdown=countdown, eta=eta, task_id=task_id,
            connection=connection, expires=expires, link=link, link_error=link_error,
            time_limit=time_limit, soft_time_limit=soft_time_limit, root_id=root_id,
            parent_id=parent_id, route_name=route_name, shadow=shadow, task_type=task_type,
            **options)

    def AsyncResult(self, task_id: str, backend: Any = None,
                    task_name: str | None = None, app: Any = None,
                    parent: Any = None) -> AsyncResult:
        """The result of the task with this id."""
        return AsyncResult(task_id, backend=backend, task_name=task_name, app=self,
                           parent=parent)

    @property
    def backend(self) -> Any:
        """The result backend: Celery's backend methods, answered from the jobs table
        (``akadze_compat.backends.database.DatabaseBackend``)."""
        backend = self.__dict__.get("_backend")
        if backend is None:
            backend = self.__dict__["_backend"] = DatabaseBackend(self)
        return backend

    @property
    def amqp(self) -> Any:
        """``app.amqp``: the queue declarations (``queues``, ``default_queue``, ``router``)."""
        amqp = self.__dict__.get("_amqp")
        if amqp is None:
            amqp = self.__dict__["_amqp"] = AMQP(self)
        return amqp

    @property
    def GroupResult(self) -> type[GroupResult]:
        """``GroupResult`` bound to this app: ``app.GroupResult(id, results)``,
        ``app.GroupResult.restore(id)``."""
        bound = self.__dict__.get("_group_result")
        if bound is None:
            bound = self.__dict__["_group_result"] = _bound_group_result(self)
        return bound

    @property
    def current_task(self) -> _Task | None:
        """The task being run here (by a worker or eagerly), or None."""
        return _state.get_current_task()

    @property
    def current_worker_task(self) -> _Task | None:
        """The task a worker is running here, or None."""
        return _state.get_current_worker_task()


def _bound_group_result(owner: Celery) -> type[GroupResult]:
    class BoundGroupResult(GroupResult):
        def __init__(self, id: str | None = None, results: list[Any] | None = None,
                     parent: Any = None, **kwargs: Any) -> None:
            kwargs.setdefault("app", owner)
            super().__init__(id, results, parent, **kwargs)

        @classmethod
        def restore(cls, id: str, backend: Any = None, app: Celery | None = None
                    ) -> GroupResult | None:
            return GroupResult.restore(id, backend, app=app or owner)

    BoundGroupResult.__name__ = BoundGroupResult.__qualname__ = "GroupResult"
    return BoundGroupResult


def _default_app() -> Celery:
    return Celery("default", set_as_current=False)


_state.set_default_app_factory(_default_app)
