#!/usr/bin/env python3
"""Generate ``migration_guide/celery-settings.md`` and ``celery-api.md``.

Run it from the repository root with the project's Python (akadze installed)::

    python migration_guide/tools/celery_tables.py           # rewrite both files
    python migration_guide/tools/celery_tables.py --check   # exit 1 if they are stale

The lists come from Celery itself: every setting of ``celery/app/defaults.py`` and every
public name of ``celery``, ``celery.exceptions``, ``celery.signals``, ``celery.result``,
``celery.schedules`` (plus ``celery.states``, ``celery.utils.log`` and the members of
``Celery``, ``Task`` and ``AsyncResult``). Celery is imported only in a child process run
with Celery's own interpreter: ``--celery-python``, else ``$CELERY_PYTHON``, else
``/tmp/akadze-celery-venv/bin/python`` (``python -m venv /tmp/akadze-celery-venv &&
/tmp/akadze-celery-venv/bin/pip install celery==5.7.0``). This script is never imported by the
package or the tests.

What akadze does with each name:

- settings, signals and task options: ``akadze_compat.support`` (the table the
  ``akadze-compat doctor`` command reads too), so a claim lives in one place;
- every other API name: ``API_NOTES`` below, written by hand after reading the code and
  trying it; a name ``akadze_compat`` lacks is always "missing", whatever the note says
  (the script stops when a note claims more than the import finds).

Checks made on every run: the settings Celery has and the ones akadze_compat accepts are the
same list; every "honoured" or "different" setting is read somewhere in ``akadze_compat``;
every note names something Celery has.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "migration_guide"
DEFAULT_CELERY_PYTHON = "/tmp/akadze-celery-venv/bin/python"

# Run in Celery's interpreter: prints what Celery has, as JSON.
CELERY_SIDE = r'''
import json
import celery
from celery.app.defaults import NAMESPACES, flatten
from celery.utils.dispatch import Signal

def defined_in(module):
    names = set(getattr(module, "__all__", ()))
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, Signal) or getattr(value, "__module__", None) == module.__name__:
            names.add(name)
    return sorted(names)

import importlib, sys
import celery.exceptions, celery.result, celery.schedules, celery.signals, celery.states
import celery.utils.log
from celery.app.task import Task
from celery.result import AsyncResult

# The lazy module's __all__ also lists its private helpers and Celery 3's old modules
# (execute, messaging, registry, log): the public attributes are what dir() shows.
top = {n for n in dir(celery) if not n.startswith("_")} | {"subtask"}  # lazy, not in dir()
modules = {"celery": sorted(top)}
for module in (celery.exceptions, celery.signals, celery.result, celery.schedules,
               celery.states, celery.utils.log):
    modules[module.__name__] = defined_in(module)
# The deeper paths real projects import; celery.contrib.pytest needs pytest in
# Celery's interpreter and is covered by the guide's "Testing your tasks" instead.
for name in sys.argv[1:]:  # DEEP_MODULES
    modules[name] = defined_in(importlib.import_module(name))
members = {cls.__name__: sorted(n for n in dir(cls) if not n.startswith("_"))
           for cls in (celery.Celery, Task, AsyncResult)}
settings = [[name, repr(option.default)] for name, option in flatten(NAMESPACES)]
print(json.dumps({"version": celery.__version__, "settings": settings, "modules": modules,
                  "members": members}))
'''

S, D, IGN, M = "supported", "different", "ignored", "missing"

_CANVAS = ("Celery's composition and results; sent as one workflow in one transaction: every task "
           "is a job at once, released by the database in the transaction that stores what "
           "it waits on; a chain step after a failure never runs and reads FAILURE with that "
           "failure, and `get()` checks the parents first, as Celery "
           "([celery.md](celery.md#canvas))")
_NEVER_RAISED = "defined with Celery's hierarchy, for `except` clauses; akadze never raises it"
_NO_BROKER = "there is no broker connection: the queue is the Postgres database"
_CLI = "use the `akadze-compat` command"
_INTERNAL = "Celery internals, not provided"
_VERSION = ("Celery 5.7.0's: the Celery API akadze_compat follows (add-ons read it under the "
            "celery alias); akadze's own version is the `akadze` distribution's")

#: "module:name" (module "Celery", "Task", "AsyncResult" for members) -> (status, note).
API_NOTES: dict[str, tuple[str, str]] = {
    # --- celery.bootsteps
    "celery.bootsteps:Step": (D, "`app.steps[\"worker\"]` / `[\"consumer\"]` steps run in "
                                 "`akadze-compat worker`'s main process at Celery's points "
                                 "(each prefork child creates them too, never starts them); "
                                 "consumer steps get the worker, requirements naming "
                                 "Celery's own steps are met already"),
    "celery.bootsteps:ConsumerStep": (M, "imports and subclasses; the worker refuses to start "
                                         "with one: there is no kombu channel for "
                                         "`get_consumers`"),
    "celery.bootsteps:StartStopStep": (D, "started before `worker_ready`, stopped before "
                                          "`worker_shutdown`, as Celery; the worker has "
                                          "`timer.call_repeatedly` but no pool, consumer or hub"),
    # --- celery.beat
    "celery.beat:Scheduler": (D, "Celery's class, for subclasses and wrappers (celery-redbeat, "
                                 "tracing agents); akadze's workers run `beat_schedule` "
                                 "themselves, not through a Scheduler; `producer` is None"),
    "celery.beat:ScheduleEntry": (D, "Celery's class, for subclasses (celery-redbeat); "
                                     "`beat_schedule` entries do not pass through it"),
    # --- celery
    "celery:Celery": (D, "`broker_url` must be a Postgres URL (none: `$AKADZE_DATABASE_URL`, "
                         "else the embedded Postgres); `result_backend` is ignored"),
    "celery:Signature": (S, "a dict, as Celery's; rebuilt from JSON by `subtask_type`"),
    "celery:bugreport": (M, ""),
    "celery:chain": (D, _CANVAS), "celery:chord": (D, _CANVAS),
    "celery:chunks": (D, _CANVAS), "celery:group": (D, _CANVAS),
    "celery:xmap": (D, _CANVAS), "celery:xstarmap": (D, _CANVAS),
    "celery:current_app": (D, "one current app per process (Celery: per thread)"),
    "celery:signature": (S, "options merged, partial args, `freeze`, `link`/`link_error` "
                            "(run by the database: see `Task.apply_async`), `|` as Celery's"),
    "celery:subtask": (D, "alias of `signature`"),
    "celery:maybe_signature": (S, ""),
    "celery:local": (M, "`celery.local` (Proxy, PromiseProxy) is not provided"),
    "celery:maybe_patch_concurrency": (M, "eventlet and gevent are not supported (`-P "
                                          "eventlet` runs the threads pool)"),
    "celery:SERIES": (D, _VERSION),
    "celery:VERSION": (D, _VERSION),
    "celery:VERSION_BANNER": (D, _VERSION),
    "celery:version_info": (D, _VERSION),
    "celery:version_info_t": (D, _VERSION),
    # --- celery.exceptions
    "celery.exceptions:Ignore": (D, "the state stays as it was, as in Celery: PENDING, or the "
                                    "custom state the body set with `update_state` (a FAILURE "
                                    "with `exc_type`/`exc_message` reads as that exception) "
                                    "and nothing waiting on it runs; the job ends cancelled "
                                    "without a result, so `get()` returns None instead of "
                                    "waiting"),
    "celery.exceptions:Reject": (D, "`requeue=True`: back to the queue without spending a "
                                    "retry; `requeue=False`: FAILURE"),
    "celery.exceptions:Retry": (S, "raised by `self.retry()`; the task keeps its id"),
    "celery.exceptions:RetryTaskError": (S, "alias of Retry"),
    "celery.exceptions:MaxRetriesExceededError": (S, ""),
    "celery.exceptions:TimeLimitExceeded": (D, "prefork: the task's FAILURE once its child "
                                               "was killed at the hard limit, as Celery's; "
                                               "threads/solo: raised inside the body (the "
                                               "process is not killed); see task_time_limit"),
    "celery.exceptions:SoftTimeLimitExceeded": (D, "raised inside the body; prefork: by "
                                                   "SIGUSR1, interrupting a blocking call, as "
                                                   "Celery's; threads/solo: a plain `def` "
                                                   "blocked in C code sees it only when the "
                                                   "call returns"),
    "celery.exceptions:WorkerLostError": (D, "the task of a lost worker runs again (at least "
                                             "once); it fails with this only after more losses "
                                             "than max_retries allows"),
    "celery.exceptions:TaskRevokedError": (S, "the result of a REVOKED task"),
    "celery.exceptions:TimeoutError": (S, "raised by `AsyncResult.get(timeout=...)`"),
    "celery.exceptions:QueueNotFound": (S, "raised with `task_create_missing_queues=False`"),
    "celery.exceptions:NotRegistered": (D, "raised by `app.tasks[name]`; a job whose task the "
                                           "worker does not know ends FAILURE with a "
                                           "stand-in exception of that name that is not this "
                                           "class (Celery drops the message)"),
    "celery.exceptions:ImproperlyConfigured": (S, "raised for a non-Postgres broker URL and "
                                                  "for serializers other than JSON"),
    "celery.exceptions:OperationalError": (S, "kombu's class: a send that cannot reach "
                                              "Postgres, or finds it without a free "
                                              "connection, raises it after the publish "
                                              "retry policy (also "
                                              "`akadze_core.DatabaseUnavailable`); a wrong "
                                              "URL, password or database raises "
                                              "`akadze_core.ConfigurationError` at once"),
    "celery.exceptions:WorkerShutdown": (D, "raised in a task it fails that task; the worker "
                                            "goes on"),
    "celery.exceptions:WorkerTerminate": (D, "raised in a task it fails that task; the worker "
                                             "goes on"),
    "celery.exceptions:SystemTerminate": (D, "alias of WorkerTerminate"),
    "celery.exceptions:Terminated": (S, f"{_NEVER_RAISED} (a terminated task's result is "
                                        "TaskRevokedError('terminated'), as Celery's)"),
    "celery.exceptions:AlwaysEagerIgnored": (S, "warned by `send_task` in eager mode"),
    "celery.exceptions:DuplicateTaskNameWarning": (S, ""),
    "celery.exceptions:reraise": (S, ""),
    "celery.exceptions:ChordError": (S, "the result of a chord body whose header member "
                                        "failed or was revoked, as Celery's"),
    **{f"celery.exceptions:{name}": (S, _NEVER_RAISED) for name in (
        "AlreadyRegistered", "BackendError", "BackendGetMetaError", "BackendStoreError",
        "CDeprecationWarning", "CPendingDeprecationWarning", "CeleryCommandException",
        "CeleryError", "CeleryWarning", "DuplicateNodenameWarning",
        "FixupWarning", "IncompleteStream", "InvalidTaskError", "NotConfigured",
        "SecurityError", "SecurityWarning", "TaskError", "TaskPredicate")},
    # --- celery.result
    "celery.result:AsyncResult": (D, "reads the task's job row; see its members below"),
    "celery.result:EagerResult": (S, ""),
    "celery.result:GroupResult": (D, "members read in one query, waited for on "
                                     "LISTEN/NOTIFY; `save()` stores the group in the "
                                     "`akadze.saved_groups` table"),
    "celery.result:ResultSet": (D, "members read in one query, waited for on LISTEN/NOTIFY"),
    "celery.result:ResultBase": (S, ""),
    "celery.result:result_from_tuple": (S, ""),
    "celery.result:allow_join_result": (S, "`get()` inside a task raises RuntimeError "
                                           "outside this block"),
    "celery.result:denied_join_result": (S, ""),
    "celery.result:assert_will_not_block": (S, ""),
    # --- celery.schedules
    "celery.schedules:crontab": (D, "Celery's parsing, matching, `remaining_estimate()` and "
                                    "`is_due()`, checked against Celery 5.7; in the workers "
                                    "the ticks are computed ahead, exactly once per tick"),
    "celery.schedules:schedule": (D, "`remaining_estimate()`/`is_due()` as Celery's; in the "
                                     "workers it ticks on a fixed grid since the Unix epoch "
                                     "(Celery: counted from the last run)"),
    "celery.schedules:solar": (D, "as Celery's with the ephem package (`akadze[solar]`); "
                                  "without it, built but a worker refuses to start"),
    "celery.schedules:BaseSchedule": (D, "a custom subclass with `is_due()` runs in the "
                                         "workers as beat runs it, each due run enqueued once"),
    "celery.schedules:maybe_schedule": (S, ""),
    "celery.schedules:crontab_parser": (S, ""),
    "celery.schedules:ParseException": (S, ""),
    "celery.schedules:schedstate": (S, ""),
    "celery.schedules:cronfield": (M, "beat internals"),
    # --- celery.states
    "celery.states:RECEIVED": (S, "never reported: a claimed task starts at once"),
    "celery.worker.request:Request": (D, "what `task_received` receivers get: a read-only "
                                         "view of the call; `Task.Request` subclasses are "
                                         "not used"),
    "celery.states:IGNORED": (S, "never reported: an ignored task keeps its previous state"),
    "celery.states:STARTED": (S, "reported only with `track_started`"),
    # --- celery.utils.log
    **{f"celery.utils.log:{name}": (M, "worker internals, not provided") for name in (
        "ColorFormatter", "LoggingProxy", "in_sighandler", "set_in_sighandler",
        "get_multiprocessing_logger", "reset_multiprocessing_logger", "current_process",
        "current_process_index", "iter_open_logger_fds", "logger_isa")},
    # --- Celery (the app)
    "Celery:add_periodic_task": (D, "every worker schedules it, each tick enqueued once"),
    "Celery:autodiscover_tasks": (S, "imports when a worker starts, or at once with "
                                     "`force=True`"),
    "Celery:control": (D, "Celery's commands and `inspect()` with its reply shapes, answered "
                          "by the live workers through the database (`revoke(terminate=True)` "
                          "ends the prefork child); no events, autoscale or election"),
    "Celery:send_task": (D, "for a task the sender does not know, the worker's max_retries "
                            "decides"),
    "Celery:annotations": (M, "task_annotations are not applied"),
    "Celery:amqp": (D, "`queues`, `default_queue`, `default_exchange`, `router` and `Queues()` "
                       "from the settings; no producers or messages (`producer_pool`... "
                       "raise AttributeError saying so)"),
    "Celery:backend": (D, "Celery's backend methods answered from the jobs table "
                          "(`get_task_meta`, `get_state`, `get_result`...); `store_result` and "
                          "`mark_as_*` store a state only for the task running here, "
                          "`mark_as_revoked` revokes, `forget` deletes nothing"),
    "Celery:backend_cls": (M, "no result backend object: AsyncResult reads the job"),
    "Celery:events": (M, "no event stream"), "Celery:events_cls": (M, "no event stream"),
    "Celery:start": (D, "runs the `akadze-compat` command for the app in a new process, "
                        "which imports the app's module; in a script's `if __name__ == "
                        "\"__main__\"` block the process becomes the command"),
    "Celery:worker_main": (D, "as `start`, which it calls"),
    "Celery:Worker": (M, _CLI),
    "Celery:WorkController": (M, _CLI),
    "Celery:Beat": (M, "beat runs inside every worker"),
    "Celery:bugreport": (S, "Celery's sections, naming akadze's and psycopg's versions, the "
                            "database as transport and the job rows as results"),
    "Celery:Pickler": (M, "no pickle"),
    "Celery:GroupResult": (S, "bound to the app (`app.GroupResult.restore(id)`)"),
    "Celery:ResultSet": (M, "use `akadze_compat.result.ResultSet`"),
    "Celery:user_options": (M, "custom command-line options are not supported"),
    "Celery:setup_security": (M, "message signing is not supported"),
    **{f"Celery:{name}": (M, _NO_BROKER) for name in (
        "amqp_cls", "broker_connection", "connection", "connection_for_read",
        "connection_for_write", "connection_or_acquire", "default_connection",
        "default_producer", "pool", "producer_or_acquire", "producer_pool", "select_queues")},
    **{f"Celery:{name}": (M, _INTERNAL) for name in (
        "IS_WINDOWS", "IS_macOS", "SYSTEM", "builtin_fixups", "control_cls",
        "create_task_cls", "either", "loader_cls", "log", "log_cls", "oid", "prepare_config",
        "registry_cls", "steps", "subclass_with_self", "thread_oid", "type_checker")},
    # --- Task
    "Task:apply_async": (D, "countdown, eta, expires, queue, priority, task_id, headers, "
                            "time_limit, soft_time_limit, ignore_result, `connection=` (a "
                            "psycopg connection whose transaction the job joins), link "
                            "(a job waiting for this one) and link_error (inserted when it "
                            "fails, called as Celery calls errbacks); kombu's message "
                            "properties (`app_id`, `user_id`, `type`...) reach "
                            "`request.properties`, other kombu options are ignored"),
    "Task:retry": (D, "same task id; `throw=False` schedules no retry; `queue=`/`priority=` "
                      "are ignored; `args=`/`kwargs=` work"),
    "Task:update_state": (D, "only for the task running here (other ids: a warning); does "
                             "nothing in eager mode"),
    "Task:max_retries": (S, "None retries forever"),
    "Task:request": (D, "`hostname` is the worker's `-n`; `id` is the task id, derived from "
                        "the job id for a job stored without one (see celery.md, Task ids)"),
    "Task:map": (S, "one `celery.map` task, as Celery's"),
    "Task:starmap": (S, "one `celery.starmap` task, as Celery's"),
    "Task:chunks": (S, "a group of `celery.starmap` tasks, as Celery's"),
    "Task:replace": (D, "as Celery 5.7's (frozen with the task id; a group gets a "
                        "`celery.accumulate` body; the chain's rest, a chord's place, "
                        "`link` callbacks and errbacks pass to it; `Ignore` is raised), but "
                        "the replacement, the hand-over and the task's end are one "
                        "transaction: a worker lost meanwhile leaves none of it and the "
                        "rerun replaces once"),
    "Task:on_replace": (S, "sends the replacement and raises `Ignore` (eager: returns its "
                           "result)"),
    "Task:add_to_chord": (M, "a chord's header is fixed when it is sent"),
    "Task:send_event": (M, "no event stream"),
    "Task:OperationalError": (M, ""),
    "Task:acks_on_failure": (M, "a failed task ends FAILURE; it is never put back"),
    "Task:acks_on_timeout": (M, "a timed-out task ends FAILURE; it is never put back"),
    "Task:retry_on_worker_lost": (M, "the task of a lost worker always runs again"),
    **{f"Task:{name}": (M, _INTERNAL) for name in (
        "Request", "Strategy", "start_strategy", "add_around", "add_trail", "annotate",
        "from_config", "on_bound", "signature_from_request",
        "subtask_from_request")},
    # --- AsyncResult
    "AsyncResult:get": (D, "wakes on LISTEN/NOTIFY, no polling; a failure comes back as its "
                           "class called with its arguments, Celery's "
                           "`UnpickleableExceptionWrapper` when that call fails (never "
                           "unpickled); inside a "
                           "task it raises RuntimeError unless `disable_sync_subtasks=False` "
                           "or `allow_join_result()`; the parents are checked first, as "
                           "Celery's (`follow_parents`); a chain step after a revoked one "
                           "raises `TaskRevokedError` even without parents (Celery waits)"),
    "AsyncResult:result": (D, "on FAILURE the exception rebuilt from its class and "
                              "arguments; dicts come back with keys in jsonb's order"),
    "AsyncResult:info": (D, "as `result`"),
    "AsyncResult:state": (S, "unknown id: PENDING; a retry waiting: RETRY; STARTED only with "
                             "track_started"),
    "AsyncResult:id": (S, "a uuid4 string, or the `task_id=` given; `job_id` (not in Celery) "
                          "is the akadze job's id"),
    "AsyncResult:forget": (D, "deletes nothing: the job goes when its retention ends "
                              "(result_expires)"),
    "AsyncResult:revoke": (D, "a waiting task never runs; `terminate=True` ends the prefork "
                              "child running it (threads/solo: it runs on)"),
    "AsyncResult:children": (D, "the canvas jobs waiting on this task (next chain step, "
                                "chord body, `link` callbacks), once it finished; tasks "
                                "sent from its body are not tracked"),
    "AsyncResult:collect": (S, "over `children`"), "AsyncResult:iterdeps": (S, ""),
    "AsyncResult:worker": (D, "always None (not recorded)"),
    "AsyncResult:backend": (S, "`app.backend` (see `Celery.backend`)"),
    "AsyncResult:TimeoutError": (M, "import it from `akadze_compat.exceptions`"),
    "AsyncResult:then": (M, "no promises"), "AsyncResult:throw": (M, "no promises"),
    "AsyncResult:revoke_by_stamped_headers": (M, "no stamping"),
    "AsyncResult:supports_native_join": (M, ""),
    "AsyncResult:build_graph": (S, "a `DependencyGraph` (`akadze_compat.utils.graph`) of "
                                   "the result and its `children`, as Celery's"),
    "AsyncResult:graph": (S, "`build_graph()`, kept once built"),
    "AsyncResult:get_leaf": (S, "over `iterdeps()`"),
}

#: Where each Celery module lives in akadze_compat.
#: Celery's module paths below the top level that real projects import.
DEEP_MODULES = ("celery.app.task", "celery._state", "celery.app.control", "celery.app.trace",
                "celery.beat", "celery.backends.base", "celery.worker.control",
                "celery.worker.request", "celery.bootsteps", "celery.utils.time",
                "celery.utils.threads", "celery.contrib.abortable",
                "celery.contrib.testing.worker")
AKADZE_MODULES = {"celery": "akadze_compat", "celery.exceptions": "akadze_compat.exceptions",
                  "celery.signals": "akadze_compat.signals", "celery.result":
                  "akadze_compat.result", "celery.schedules": "akadze_compat.schedules",
                  "celery.states": "akadze_compat.states",
                  "celery.utils.log": "akadze_compat.utils.log",
                  **{name: "akadze_compat" + name.removeprefix("celery") for name in DEEP_MODULES}}
#: "different" settings whose difference is that they are not read (results are always JSON).
NOT_READ = frozenset({"result_serializer"})
#: support.py's words -> the API table's.
SUPPORT_STATUS = {"honoured": S, "different": D, "ignored": IGN, "missing": M}


# --- the two sides --------------------------------------------------------------------------

def celery_side(python: str) -> dict[str, Any]:
    """What Celery has, from its own interpreter."""
    try:
        output = subprocess.run([python, "-c", CELERY_SIDE, *DEEP_MODULES],
                                capture_output=True, text=True,
                                check=True, timeout=120).stdout
    except FileNotFoundError:
        sys.exit(f"no Celery interpreter at {python}: pass --celery-python or set CELERY_PYTHON")
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{python} could not list Celery's names:\n{exc.stderr}")
    return json.loads(output)


def akadze_members() -> dict[str, Any]:
    """Instances whose attributes are checked: an app, one of its tasks, a result."""
    from akadze_compat import Celery
    from akadze_compat.result import AsyncResult

    app = Celery("tables", set_as_current=False)

    @app.task
    def task() -> None:
        """A task to look at."""

    return {"Celery": app, "Task": task, "AsyncResult": AsyncResult("1", app=app)}


def provides(module: Any, name: str) -> bool:
    """Whether ``module`` has ``name``: a name it refuses on purpose (an ImportError naming
    the guide's section, from the module's ``__getattr__``) counts as missing."""
    try:
        getattr(module, name)
    except (AttributeError, ImportError):
        return False
    return True


def has_member(instance: Any, name: str) -> bool:
    # The class and the instance's own dict: no property is evaluated.
    return hasattr(type(instance), name) or name in vars(instance)


def akadze_sources() -> str:
    package = ROOT / "akadze_compat"
    return "\n".join(path.read_text() for path in sorted(package.rglob("*.py"))
                     if path.name not in ("defaults.py", "support.py", "doctor.py",
                                          "doctor_scan.py"))


# --- rows ---------------------------------------------------------------------------------

def api_row(where: str, name: str, present: bool, support: dict[str, Any],
            problems: list[str]) -> tuple[str, str]:
    """(status, note) of one API name."""
    key = f"{where}:{name}"
    if key in API_NOTES:
        status, note = API_NOTES[key]
    elif name in support:
        status, note = SUPPORT_STATUS[support[name].status], support[name].note
    else:
        status, note = (S, "") if present else (M, "")
    if not present and status != M:
        problems.append(f"{key}: the note says {status!r} but akadze_compat has no such name")
        status = M
    return status, note


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines


def counts(statuses: list[str]) -> str:
    order = ["honoured", S, D, IGN, M]
    found = {status: statuses.count(status) for status in order if status in statuses}
    return ", ".join(f"{number} {status}" for status, number in found.items())


HEADER = ("<!-- Generated by migration_guide/tools/celery_tables.py from Celery {version} and "
          "akadze_compat; edit the notes there (or in akadze_compat/support.py), not here. -->")


def settings_page(celery: dict[str, Any], problems: list[str]) -> str:
    from akadze_compat.app.defaults import DEFAULTS, TO_OLD_NAME
    from akadze_compat.support import EXTRA_SETTINGS, SETTING_SUPPORT

    names = [name for name, _ in celery["settings"]]
    if set(names) != set(DEFAULTS):
        problems.append(f"settings Celery has and akadze_compat lacks: "
                        f"{sorted(set(names) - set(DEFAULTS))}; the reverse: "
                        f"{sorted(set(DEFAULTS) - set(names))}")
    source = akadze_sources()
    rows_by_group: dict[str, list[list[str]]] = {}
    statuses = []
    for name, default in celery["settings"]:
        support = SETTING_SUPPORT.get(name)
        if support is None:
            problems.append(f"setting {name} has no entry in akadze_compat.support")
            continue
        old = TO_OLD_NAME.get(name, "")
        if (support.status in ("honoured", "different") and name not in NOT_READ
                and not any(re.search(rf"\b{re.escape(spelling)}\b", source)
                            for spelling in (name, old))):
            problems.append(f"setting {name} is {support.status} but akadze_compat never reads "
                            "it")
        status = support.status
        statuses.append(status)
        group = name.split("_", 1)[0] if "_" in name and name.split("_", 1)[0] in GROUPS \
            else ""
        rows_by_group.setdefault(group, []).append(
            [f"`{name}`", f"`{old}`" if old else "", f"`{default}`",
             f"**{status}**" if status != IGN else status, support.note])
    lines = [
        HEADER.format(version=celery["version"]), "",
        "# Every Celery setting, and what akadze_compat does with it", "",
        f"All {len(names)} settings of Celery {celery['version']} (`celery/app/defaults.py`) "
        f"are accepted, under their new names, their old upper-case names and, with "
        "`config_from_object(..., namespace=\"CELERY\")`, the `CELERY_` prefixed ones "
        f"(Django). Summary: {counts(statuses)}.", "",
        "- **honoured**: takes effect as in Celery (the note says how it is read);",
        "- **different**: takes effect, with the difference the note describes;",
        "- ignored: accepted and without effect here (the note says why and what to do "
        "instead).", "",
        "A value that cannot work stops the app when it first connects (a broker URL that is "
        "not Postgres; `task_serializer` or `accept_content` other than JSON), with a message "
        "saying what to set. `akadze-compat -A proj doctor` lists the settings a project "
        "actually sets, with these notes.", "",
        "Settings akadze_compat reads that Celery does not have:", "",
    ]
    lines += table(["setting", "status", "note"],
                   [[f"`{name}`", support.status, support.note]
                    for name, support in EXTRA_SETTINGS.items()])
    for group, title in GROUPS.items():
        rows = rows_by_group.get(group)
        if not rows:
            continue
        lines += ["", f"## {title}", ""]
        lines += table(["setting", "old name", "Celery default", "status", "note"], rows)
    return "\n".join(lines) + "\n"


GROUPS = {
    "": "General", "broker": "Broker", "task": "Tasks", "result": "Results", "worker": "Worker",
    "beat": "Beat", "control": "Remote control", "event": "Events", "security": "Security",
    "database": "Result backend: database", "redis": "Result backend: Redis",
    "cache": "Result backend: cache", "cassandra": "Result backend: Cassandra",
    "s3": "Result backend: S3", "azureblockblob": "Result backend: Azure Block Blob",
    "gcs": "Result backend: Google Cloud Storage", "couchbase": "Result backend: Couchbase",
    "arangodb": "Result backend: ArangoDB", "mongodb": "Result backend: MongoDB",
    "cosmosdbsql": "Result backend: CosmosDB", "elasticsearch": "Result backend: Elasticsearch",
}


def api_page(celery: dict[str, Any], problems: list[str]) -> str:
    from akadze_compat.support import SIGNAL_SUPPORT, TASK_OPTION_SUPPORT

    sections: list[str] = []
    statuses: list[str] = []
    app_signals = {name.split(".", 1)[1]: support for name, support in SIGNAL_SUPPORT.items()
                   if name.startswith("app.")}
    for module_name, names in celery["modules"].items():
        module = importlib.import_module(AKADZE_MODULES[module_name])
        support = SIGNAL_SUPPORT if module_name == "celery.signals" else {}
        rows = []
        for name in names:
            status, note = api_row(module_name, name, provides(module, name), support,
                                   problems)
            statuses.append(status)
            rows.append([f"`{name}`", f"**{status}**" if status != S else status, note])
        sections += ["", f"## `{module_name}` → `{AKADZE_MODULES[module_name]}`", ""]
        sections += table(["name", "status", "note"], rows)
    instances = akadze_members()
    titles = {"Celery": "The app: `Celery` members", "Task": "`Task` members",
              "AsyncResult": "`AsyncResult` members"}
    for cls_name, names in celery["members"].items():
        support = {"Celery": app_signals, "Task": TASK_OPTION_SUPPORT}.get(cls_name, {})
        rows = []
        for name in names:
            present = has_member(instances[cls_name], name)
            status, note = api_row(cls_name, name, present, support, problems)
            statuses.append(status)
            rows.append([f"`{name}`", f"**{status}**" if status != S else status, note])
        sections += ["", f"## {titles[cls_name]}", ""]
        sections += table(["name", "status", "note"], rows)
    known = {f"{where}:{name}" for where, names in celery["modules"].items() for name in names}
    known |= {f"{where}:{name}" for where, names in celery["members"].items() for name in names}
    problems += [f"API_NOTES names {key}, which Celery {celery['version']} does not have"
                 for key in API_NOTES if key not in known]
    head = [
        HEADER.format(version=celery["version"]), "",
        "# Every public Celery name, and where it stands in akadze_compat", "",
        f"The public names of Celery {celery['version']}'s `celery`, `celery.exceptions`, "
        "`celery.signals`, `celery.result`, `celery.schedules`, `celery.states`, "
        "`celery.utils.log` and of the deeper paths real projects import ("
        + ", ".join(f"`{name}`" for name in DEEP_MODULES) + ") "
        "(their `__all__` and what they define), and the public members of "
        "`Celery`, `Task` and `AsyncResult`, each checked by importing it from "
        f"`akadze_compat`. Summary: {counts(statuses)}.", "",
        "- supported: same name, same behaviour as far as a caller can tell;",
        "- **different**: there, with the difference the note describes;",
        "- **ignored**: accepted and without effect (task options);",
        "- **missing**: not there (an ImportError or AttributeError), or there but refusing to "
        "work (NotImplementedError), or a signal that is never sent.", "",
        "Celery's other module paths import too, under the same names: `akadze_compat.app.task` "
        "(`Task`, `Context`), `akadze_compat._state` (`current_app`, `get_current_task`), "
        "`app.control` (`Control`), `app.registry`, `app.routes`, `app.trace`, `beat`, "
        "`backends.base`, `worker.control`, `worker.request`, `bootsteps`, `utils.time`, "
        "`utils.threads`, `contrib.abortable` (`AbortableTask`, on the job's cancel flag) and "
        "`contrib.django.task` (`DjangoTask`; `delay_on_commit` is on every task, see "
        "[django.md](django.md)). What they leave out (custom beat schedulers, result "
        "backends, remote control commands, `Task.Request` subclasses) fails "
        "at the "
        "import with an ImportError naming the section of [celery.md](celery.md) that says "
        "what to do instead. `akadze_compat.canvas` (Celery's canvas) and `akadze_compat.utils` "
        "(`uuid`) exist. "
        "kombu stays as it is (`kombu.Queue` in `task_queues` is read by name).",
    ]
    return "\n".join(head + sections) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--celery-python", default=os.environ.get("CELERY_PYTHON",
                                                                  DEFAULT_CELERY_PYTHON))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the files differ from what would be written")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    celery = celery_side(options.celery_python)
    problems: list[str] = []
    pages = {GUIDE / "celery-settings.md": settings_page(celery, problems),
             GUIDE / "celery-api.md": api_page(celery, problems)}
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    stale = [path for path, text in pages.items()
             if not path.exists() or path.read_text() != text]
    if options.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python "
                  "migration_guide/tools/celery_tables.py", file=sys.stderr)
        return 1 if stale or problems else 0
    for path in stale:
        path.write_text(pages[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
