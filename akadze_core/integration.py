"""What a framework built on akadze_core needs beyond the package's public names.

``akadze_compat`` (the Celery facade) imports ``akadze_core``'s public names and this module,
and nothing else of the core (``tests/unit/test_layers.py`` holds it to that): the core's
other modules can then be reshaped without breaking a framework, and what a framework leans
on is written down here, in one place. A new need is added here, with a line saying why.

The groups, in the order of a job's path:

- **Sending and reading rows**: the statements and queries a framework runs in its own
  transactions (``run_statement``, ``load_queries``, ``JobRequest``), the SQL dialect of
  the process (``dialect``: a framework's statement that Citus cannot run as written has a
  Citus form of its own), what a transient database error is, the strict JSON encoder the
  core stores with.
- **Running a job's body**: ``decode_job`` (a claimed row into a ``Job`` and its call),
  the process pool and its child-side helpers, the job context (``akadze_core.current``),
  ``settle_heap`` for the process a framework's worker command owns.
- **Storing its outcome**: ``outcome_of`` classifies how a body ended exactly as the core's
  worker does (the size and storability checks, the redaction of error entries, the claim's
  fencing token); ``store_outcome_sync``/``store_outcome`` write it at once through the
  completer's write (fenced, an unstorable outcome failing the job), for a framework that
  must see the outcome stored before it tells its own listeners; ``decide_retry`` is the one
  rule for "retry, when, or fail" (``akadze_core.model.retry``); an ``OutcomeWriter`` in the
  core app's ``outcome_writers`` records outcomes in a table of the framework's own, in their
  transaction (the facade's ``django-db`` result backend).
- **Remote control, schedules, the command line**: the pieces a framework's own worker and
  beat commands reuse (control replies, schedule clocks, log scrubbing, worker defaults,
  the migration hint, the dashboard), ``LoopThreads``, the default executor of a loop
  that runs a worker: a framework's own ``asyncio.run`` of ``Worker.run`` then exits as
  promptly as ``Worker.run_sync`` does, and ``run_worker_loop``, the ``asyncio.run`` that
  ``Worker.run_sync`` uses (a loop whose runs take their first step where their task is
  made, ``akadze_core.execution.eager``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cli.support import (
    OneLineErrorGroup,
    ScrubbingFormatter,
    Secrets,
    StderrHandler,
    cache_pid_in_log_records,
    exit_now,
    one_line,
    printable,
    scrubbed_stdio,
)
from .enqueue.gcpause import collector_paused
from .execution.children import Terminated
from .execution.context import JobContext
from .execution.eager import run as run_worker_loop
from .execution.executor import decode_job
from .execution.heap import settle_heap
from .execution.processes import (
    AHEAD,
    AHEAD_BUDGET,
    CHILD_ENV,
    SHORT,
    ProcessPool,
    child_number,
    is_child,
    serve,
)
from .model.dsn import redact_json
from .model.outcomes import FAIL, Outcome, OutcomeWriter, error_entry, raised, succeeded
from .model.retry import RetryDecision, attempts_left, decide_retry
from .model.serialization import extends_strict_dumps, is_strict, strict_dumps
from .ops.control import revoked_task_ids, scheduled_jobs, signal_number
from .schedules.scheduler import MIN_CHECK_INTERVAL
from .schedules.triggers import EPOCH
from .store.database import JobRequest, run_statement, run_statement_sync
from .store.dberrors import SCHEMA_ERRORS, is_transient
from .store.embedded import describe_database
from .store.migrations import MIGRATE_COMMAND, schema_missing
from .store.queries import dialect, load_queries
from .worker.completer import store_outcome, store_outcome_sync
from .worker.config import DEFAULTS, seconds
from .worker.loop_threads import LoopThreads
from .worker.panel import NO_REPLY

if TYPE_CHECKING:
    from .cli.main import dashboard_options, run_dashboard
    from .cli.schedules import show_schedules
    from .ops.metrics import CONTENT_TYPE, exposition, read_database

__all__ = [
    "AHEAD",
    "AHEAD_BUDGET",
    "CHILD_ENV",
    "CONTENT_TYPE",
    "DEFAULTS",
    "EPOCH",
    "FAIL",
    "MIGRATE_COMMAND",
    "MIN_CHECK_INTERVAL",
    "NO_REPLY",
    "SCHEMA_ERRORS",
    "SHORT",
    "JobRequest",
    "LoopThreads",
    "OneLineErrorGroup",
    "Outcome",
    "OutcomeWriter",
    "ProcessPool",
    "RetryDecision",
    "ScrubbingFormatter",
    "Secrets",
    "StderrHandler",
    "Terminated",
    "attempts_left",
    "cache_pid_in_log_records",
    "child_number",
    "collector_paused",
    "dashboard_options",
    "decide_retry",
    "decode_job",
    "describe_database",
    "dialect",
    "error_entry",
    "exit_now",
    "exposition",
    "extends_strict_dumps",
    "is_child",
    "is_strict",
    "is_transient",
    "load_queries",
    "one_line",
    "outcome_of",
    "printable",
    "read_database",
    "redact_json",
    "revoked_task_ids",
    "run_dashboard",
    "run_statement",
    "run_statement_sync",
    "run_worker_loop",
    "scheduled_jobs",
    "schema_missing",
    "scrubbed_stdio",
    "seconds",
    "serve",
    "settle_heap",
    "show_schedules",
    "signal_number",
    "store_outcome",
    "store_outcome_sync",
    "strict_dumps",
]

def outcome_of(context: JobContext, *, value: Any = None,
               exc: BaseException | None = None) -> Outcome:
    """The outcome the core's worker writes for the run of ``context`` that returned
    ``value`` or raised ``exc``: classified by ``decide_retry`` with the task's backoff, the
    result encoded by the app's encoder and held to its ``max_result_bytes``, the error
    entry redacted by the app, the claim's fencing token carried (``outcomes.succeeded`` and
    ``outcomes.raised``, as the executor calls them)."""
    job, app = context, context.app  # its fields, without building the Job
    policy = app.tasks[job.task].backoff
    if exc is not None:
        return raised(job.id, job.run_count, job.attempt, exc, policy, app.redact,
                      claim_token=job.claim_token)
    return succeeded(job.id, job.run_count, job.attempt, value, policy, app.json_dumps,
                     app.max_result_bytes, claim_token=job.claim_token)


#: Names loaded on first use: the dashboard's command pieces cost an import that only the
#: command line needs (not a worker, nor an app that sends tasks).
_LAZY = {"dashboard_options": "cli.main", "run_dashboard": "cli.main",
         "show_schedules": "cli.schedules",
         # The metrics extra (prometheus_client): what a dashboard's /metrics renders.
         "CONTENT_TYPE": "ops.metrics", "exposition": "ops.metrics",
         "read_database": "ops.metrics"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    globals()[name] = value
    return value
