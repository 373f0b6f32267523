"""The migration report of ``akadze-compat doctor``: what a loaded project uses that akadze
ignores, changes or lacks.

The project is loaded as the worker loads it (the app, its configuration, its task modules
and autodiscovery), without ever touching the database. Its settings, tasks, periodic tasks
and signal receivers are then read from the loaded objects, and its source files are
scanned (``doctor_scan``). What is said about each comes from ``support``.
"""

from __future__ import annotations

import difflib
import inspect
import sys
import sysconfig
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from . import beat, signals
from .app.builtins import BUILTIN_TASKS
from .app.config import ObjectView
from .app.defaults import DEFAULTS, NAMESPACES
from .app.publish import ROUTE_KEYS, exec_options
from .app.routes import MapRoute, Router
from .app.task import FROM_CONFIG, Task
from .doctor_scan import scan_source
from .support import (
    API_PATTERNS,
    EXTRA_SETTINGS,
    HONOURED,
    IGNORED,
    MISSING,
    SETTING_SUPPORT,
    SIGNAL_SUPPORT,
    SYNC_ONLY_OPTIONS,
    TASK_OPTION_SUPPORT,
    Support,
    setting_value_support,
    task_option_value_support,
)

__all__ = ["KINDS", "Finding", "Report", "TaskInfo", "build_report"]

#: Finding kinds, most serious first; ``missing`` makes the doctor exit 1.
KINDS = ("missing", "different", "ignored", "unknown")
#: Task attributes listed with each task when set (besides TASK_OPTION_SUPPORT's).
_SHOWN_OPTIONS = ("queue", "max_retries", "default_retry_delay", "autoretry_for",
                  "retry_backoff", "expires", "track_started", "throws", *TASK_OPTION_SUPPORT)
#: Words that mark a setting as secret (config.Settings.table masks the same ones).
_HIDDEN = ("API", "TOKEN", "KEY", "SECRET", "PASS", "SIGNATURE")
#: At most this many source files are scanned (a project is not a whole virtualenv).
MAX_FILES = 5000


@dataclass
class Finding:
    """One thing to act on: in which section, how serious, about what, and where.

    ``key`` is the canonical name (the setting, task option, signal or ``API_PATTERNS``
    key); ``subject`` is how the project spells it; ``value`` is the value it sets.
    """

    section: str
    kind: str
    key: str
    subject: str
    message: str
    value: str | None = None
    where: list[str] = field(default_factory=list)


@dataclass
class TaskInfo:
    """A registered task: its name, the queue routing gives it, the options it sets."""

    name: str
    queue: str
    options: dict[str, str]
    is_async: bool


@dataclass
class Report:
    """The whole report (``--json`` prints ``as_dict()``)."""

    app: str
    config: str | None
    tasks: list[TaskInfo]
    findings: list[Finding]
    files_scanned: int
    unparsed: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Number of findings of each kind."""
        return {kind: sum(1 for item in self.findings if item.kind == kind) for kind in KINDS}

    @property
    def exit_code(self) -> int:
        """1 when the project uses something akadze lacks, else 0."""
        return 1 if self.counts()[MISSING] else 0

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"app": self.app, "config": self.config,
                "tasks": [asdict(task) for task in self.tasks],
                "findings": [asdict(finding) for finding in self.findings],
                "summary": self.counts(), "files_scanned": self.files_scanned,
                "unparsed": self.unparsed, "exit_code": self.exit_code}


def show(value: Any, limit: int = 80) -> str:
    """A short, readable form of a setting or option value."""
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, type) for v in value):
        return f"({', '.join(v.__name__ for v in value)})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) == list(default)
    try:
        return bool(value == default)
    except Exception:  # a value whose __eq__ fails is not the default
        return False


# --- settings ----------------------------------------------------------------------------------

def _spelled_names(conf: Any) -> dict[str, str]:
    """Every name the app reads a setting under (old, namespaced, new) -> the setting."""
    names: dict[str, str] = {}
    for setting in [*DEFAULTS, *EXTRA_SETTINGS]:
        for spelled in conf.spellings(setting):
            names.setdefault(spelled, setting)
    return names


def _is_django(source: Any) -> bool:
    obj = source.obj if isinstance(source, ObjectView) else source
    return type(obj).__module__.startswith("django.")


def _looks_like_setting(name: str, value: Any, prefix: str | None, from_source: bool,
                        django: bool) -> bool:
    """Whether an unknown name in the configuration is meant as a Celery setting."""
    if name.startswith("_") or inspect.ismodule(value) or inspect.isclass(value) or \
            inspect.isroutine(value):
        return False
    if not from_source:
        return True  # Celery(**settings), conf.update(), conf.x = ...: all meant as settings
    if prefix:
        return name.startswith(prefix)
    if name.islower():
        return not django or name.split("_")[0] in NAMESPACES
    return name.startswith(("CELERY", "BROKER_"))


def _setting_findings(app: Any) -> list[Finding]:
    conf = app.conf
    spelled = _spelled_names(conf)
    prefix = f"{conf.namespace}_" if conf.namespace else None
    source = conf.source
    found: dict[str, list[str]] = {}
    unknown: list[Finding] = []
    django = _is_django(source)
    for from_source, layer in [(False, conf.changes), (True, source or {})]:
        for name in list(layer):
            setting = spelled.get(name)
            if setting is not None:
                found.setdefault(setting, [])
                if name not in found[setting]:
                    found[setting].append(name)
                continue
            try:
                value = layer[name]
            except Exception:  # a settings object's property may raise: not ours to judge
                continue
            if _looks_like_setting(name, value, prefix, from_source, django):
                close = difflib.get_close_matches(name, list(spelled), n=1, cutoff=0.8)
                hint = f" (did you mean {close[0]}?)" if close else ""
                unknown.append(Finding("settings", "unknown", name, name,
                                       f"not a Celery setting: it has no effect{hint}",
                                       show(value)))
    findings = []
    for setting, names in found.items():
        value = conf[setting]
        if _same(value, DEFAULTS.get(setting)):
            continue
        support = SETTING_SUPPORT.get(setting) or EXTRA_SETTINGS[setting]
        checked = conf.broker_url if setting == "broker_url" else value
        support = setting_value_support(setting, checked) or support
        if support.status == HONOURED:
            continue
        shown = "'********'" if any(word in setting.upper() for word in _HIDDEN) \
            else show(value)
        label = " / ".join(names)
        findings.append(Finding("settings", support.status, setting, label, support.note,
                                shown))
    return findings + unknown


def _beat_findings(app: Any) -> list[Finding]:
    conf = app.conf
    zone = beat.schedule_timezone(conf.timezone, conf.enable_utc)
    findings = []
    for name, entry in dict(conf.beat_schedule or {}).items():
        try:
            _, ignored = beat.schedule_arguments(app, str(name), entry, zone)
        except Exception as exc:
            findings.append(Finding("periodic tasks", MISSING, "beat_schedule", str(name),
                                    f"the worker refuses to start: this entry cannot be "
                                    f"scheduled: {type(exc).__name__}: {exc}"))
            continue
        if ignored:
            options = ", ".join(ignored)
            what = f"the option {options} does" if len(ignored) == 1 \
                else f"the options {options} do"
            findings.append(Finding("periodic tasks", IGNORED, "beat_schedule", str(name),
                                    f"{what} not apply to periodic runs: ignored"))
    return findings


# --- tasks -------------------------------------------------------------------------------------

def explicit_options(task: Task, conf: Any) -> dict[str, Any]:
    """The options a task sets itself: not Task's default, nor taken from a setting."""
    from_config = dict(FROM_CONFIG)
    options = {}
    for attribute in _SHOWN_OPTIONS:
        value = getattr(task, attribute, None)
        if attribute == "backend" and value is getattr(task.app, "backend", None):
            continue  # Task.backend is the app's unless the task sets one
        if _same(value, getattr(Task, attribute, None)):
            continue
        setting = from_config.get(attribute)
        if setting is not None and _same(value, conf.get(setting)):
            continue  # bind() copied the setting: reported with the settings
        options[attribute] = value
    return options


def _queue(app: Any, task: Task) -> str:
    """The queue a plain ``task.delay()`` goes to. Router functions are not called (that
    would run project code): they are named instead."""
    router = app.router()
    maps = [route for route in router.routes if isinstance(route, MapRoute)]
    options = {key: value for key, value in exec_options(task).items()
               if key in ROUTE_KEYS and value is not None}
    try:
        queue = Router(maps, router.queues, router.default_queue,
                       router.create_missing).route(options, str(task.name), (), {}, task)
    except Exception as exc:
        return f"? ({type(exc).__name__}: {exc})"
    if len(maps) < len(router.routes) and not options.get("queue"):
        return f"{queue['queue']} (unless a router function picks another)"
    return str(queue["queue"])


def _is_async(task: Task) -> bool:
    return inspect.iscoroutinefunction(getattr(task, "__wrapped__", None) or task.run)


def _project_tasks(app: Any) -> dict[str, Any]:
    """The app's tasks but the built-in ones every app has (``celery.map``...)."""
    return {name: task for name, task in app.tasks.items() if name not in BUILTIN_TASKS}


def _tasks(app: Any) -> tuple[list[TaskInfo], list[Finding]]:
    infos: list[TaskInfo] = []
    by_option: dict[tuple[str, Support], list[str]] = {}
    for name, task in sorted(_project_tasks(app).items()):
        options = explicit_options(task, app.conf)
        is_async = _is_async(task)
        infos.append(TaskInfo(name, _queue(app, task),
                              {key: show(value) for key, value in options.items()}, is_async))
        for option, value in options.items():
            if option not in TASK_OPTION_SUPPORT or (is_async and option in SYNC_ONLY_OPTIONS):
                continue
            support = task_option_value_support(option, value) or TASK_OPTION_SUPPORT[option]
            if support.status != HONOURED:
                by_option.setdefault((option, support), []).append(f"{name} ({show(value)})")
        for option, value in unknown_options(task).items():
            by_option.setdefault((option, _UNKNOWN_OPTION), []).append(
                f"{name} ({show(value)})")
    findings = [Finding("task options", support.status, option, option, support.note,
                        where=where) for (option, support), where in by_option.items()]
    return infos, findings


#: What ``@app.task`` puts in a task's class besides the options it was given.
_DECORATOR_ATTRIBUTES = frozenset({"_app", "name", "run", "_decorated", "_decorated_fun",
                                   "__doc__", "__module__", "__wrapped__", "__qualname__",
                                   "__dict__", "__weakref__"})
_UNKNOWN_OPTION = Support(IGNORED, "not an option akadze's Task knows: kept as an attribute "
                                   "of the task and acted on by nothing (a typo, an option "
                                   "of another Celery version, or one only a custom base "
                                   "class would read)")


def unknown_options(task: Task) -> dict[str, Any]:
    """The ``@app.task(...)`` options of a decorated task that neither akadze's Task nor the
    task's base class has: nothing reads them."""
    cls = type(task)
    if not cls.__dict__.get("_decorated"):
        return {}  # a class-based task: its own attributes are its business
    bases = cls.__mro__[1:]
    return {key: value for key, value in cls.__dict__.items()
            if key not in _DECORATOR_ATTRIBUTES and not key.startswith("__")
            and not any(hasattr(base, key) for base in bases)}


# --- signals -----------------------------------------------------------------------------------

def _receivers(signal: signals.Signal) -> Iterator[Any]:
    for _key, stored in list(signal.receivers):
        receiver = stored() if isinstance(stored, weakref.ref) else stored
        if receiver is not None:
            yield receiver


def _signal_findings(app: Any) -> list[Finding]:
    every = {name: value for name, value in vars(signals).items()
             if isinstance(value, signals.Signal)}
    every.update({f"app.{name}": getattr(app, name) for name in
                  ("on_configure", "on_after_configure", "on_after_finalize", "on_after_fork")})
    findings = []
    for name, signal in every.items():
        support = SIGNAL_SUPPORT.get(name, Support(MISSING, "never sent"))
        if support.status == HONOURED:
            continue
        receivers = [f"{getattr(receiver, '__module__', '?')}."
                     f"{getattr(receiver, '__qualname__', repr(receiver))}"
                     for receiver in _receivers(signal)]
        receivers = [where for where in receivers if not where.startswith("akadze_compat.")]
        if receivers:
            findings.append(Finding("signals", support.status, name, name, support.note,
                                    where=receivers))
    return findings


# --- source files ------------------------------------------------------------------------------

def _outside_project() -> list[Path]:
    """Where installed code lives (the standard library, site-packages, akadze itself)."""
    paths = {Path(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib", "purelib",
                                                         "platlib")}
    paths.add(Path(__file__).resolve().parent)
    paths.add(Path(__file__).resolve().parent.parent / "akadze_core")
    return [path.resolve() for path in paths]


def _roots(app: Any, spec: str | None) -> set[str]:
    """Top-level packages of the project: the app's, the task modules', the receivers'."""
    names = {spec.partition(":")[0]} if spec else set()
    names.update(app.loader.task_modules)
    names.update(str(getattr(task, "__module__", "")) for task in _project_tasks(app).values())
    if isinstance(app.config_source, str):
        names.add(app.config_source.partition(":")[0])
    for value in vars(signals).values():
        if isinstance(value, signals.Signal):
            names.update(str(getattr(r, "__module__", "")) for r in _receivers(value))
    return {name.split(".")[0] for name in names if name}


def project_files(app: Any, spec: str | None) -> list[tuple[Path, str]]:
    """The project's own source files with their module names, installed code left out."""
    outside = _outside_project()

    def installed(path: Path) -> bool:
        return any(part in ("site-packages", "dist-packages") for part in path.parts) or \
            any(path.is_relative_to(place) for place in outside)

    files: dict[Path, str] = {}
    for root in sorted(_roots(app, spec)):
        module = sys.modules.get(root)
        if not isinstance(module, ModuleType):
            continue
        # A package (namespace packages too) is all its directories; a module, its file.
        folders = [Path(folder).resolve() for folder in getattr(module, "__path__", ())]
        location = getattr(module, "__file__", None)
        if not folders and location and not installed(Path(location).resolve()):
            files[Path(location).resolve()] = root
        for folder in folders:
            if installed(folder):
                continue
            for file in sorted(folder.rglob("*.py")):
                relative = file.relative_to(folder)
                if any(part.startswith(".") or part == "__pycache__"
                       for part in relative.parts):
                    continue
                files[file] = ".".join([root, *relative.with_suffix("").parts])
    return list(files.items())[:MAX_FILES]


def _app_refs(app: Any) -> set[tuple[str, str]]:
    """``(module, attribute)`` pairs holding the app, in the modules loaded so far."""
    refs: set[tuple[str, str]] = set()
    for name, module in list(sys.modules.items()):
        if isinstance(module, ModuleType) and not name.startswith(("akadze_", "_")):
            refs.update((name, attribute) for attribute, value in list(vars(module).items())
                        if value is app)
    return refs


def _api_findings(app: Any, files: Iterable[tuple[Path, str]], unparsed: list[str]) \
        -> list[Finding]:
    task_names = {type(task).__name__ for task in _project_tasks(app).values()}
    refs, attributes = _app_refs(app), set(dir(app))
    grouped: dict[tuple[str, str], dict[str, list[int]]] = {}
    base = Path.cwd()
    for path, module in files:
        shown = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
        try:
            uses = scan_source(path.read_text("utf-8"), str(path), module=module,
                               task_names=task_names, app_refs=refs, app_attributes=attributes)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            unparsed.append(shown)
            continue
        for use in uses:
            # A wildcard names what the project uses (`app.start`), not the pattern.
            named = use.pattern == "unavailable name" or use.pattern.endswith(".*")
            subject = use.detail if named else use.pattern
            grouped.setdefault((use.pattern, subject), {}).setdefault(shown, []).append(
                use.line)
    findings = []
    for (pattern, subject), places in grouped.items():
        support = API_PATTERNS[pattern]
        where = [f"{path}:{', '.join(str(line) for line in lines)}"
                 for path, lines in places.items()]
        findings.append(Finding("api", support.status, pattern, subject, support.note,
                                where=where))
    return findings


def build_report(app: Any, spec: str | None) -> Report:
    """The report for a loaded, finalized app (``-A spec``)."""
    tasks, task_findings = _tasks(app)
    unparsed: list[str] = []
    files = project_files(app, spec)
    findings = [*_setting_findings(app), *_beat_findings(app), *task_findings,
                *_signal_findings(app), *_api_findings(app, files, unparsed)]
    order = {kind: index for index, kind in enumerate(KINDS)}
    sections = {"settings": 0, "periodic tasks": 1, "task options": 2, "signals": 3, "api": 4}
    findings.sort(key=lambda item: (sections[item.section], order[item.kind], item.subject))
    config = app.config_source if isinstance(app.config_source, str) else (
        type(app.config_source).__name__ if app.config_source is not None else None)
    return Report(app.main or "__main__", config, tasks, findings, len(files), unparsed)
