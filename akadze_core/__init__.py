"""akadze_core: a Postgres-backed job queue.

Jobs are rows; workers claim them with ``FOR UPDATE SKIP LOCKED``, heartbeat, rescue each
other's lost jobs, and write outcomes fenced by ``run_count`` and the claim's random token so
a late run never wins.
"""

from .app import App
from .context import JobContext, current
from .control import (
    ControlReply,
    broadcast,
    request_cancel,
    request_cancel_sync,
    requeue,
    requeue_sync,
)
from .dsn import password_of, redact, redact_password
from .errors import (
    AkadzeError,
    Cancel,
    ConfigurationError,
    ConnectionLost,
    DatabaseUnavailable,
    Fail,
    InvalidArgs,
    JobTimeout,
    NoDatabaseError,
    NotOwner,
    ResultNotJson,
    ResultTooLarge,
    Retry,
    SchemaMissing,
    Snooze,
    UnstorableOutcome,
    UpstreamFailed,
)
from .jobs import Job
from .retry import BackoffPolicy, default_backoff
from .runtime_schedules import RuntimeSchedules, StoredSchedule
from .schedules import Schedule, Scheduler, ScheduleSpec, run_schedules
from .tasks import Task, TaskCall
from .triggers import Cron, Every, Trigger
from .worker import Worker, WorkerError
from .worker_config import WorkerConfig
from .workflow import Node, OnFailure, Workflow

__all__ = [
    "AkadzeError",
    "App",
    "BackoffPolicy",
    "Cancel",
    "ConfigurationError",
    "ConnectionLost",
    "ControlReply",
    "Cron",
    "DatabaseUnavailable",
    "Every",
    "Fail",
    "InvalidArgs",
    "Job",
    "JobContext",
    "JobTimeout",
    "NoDatabaseError",
    "Node",
    "NotOwner",
    "OnFailure",
    "ResultNotJson",
    "ResultTooLarge",
    "Retry",
    "RuntimeSchedules",
    "Schedule",
    "ScheduleSpec",
    "Scheduler",
    "SchemaMissing",
    "Snooze",
    "StoredSchedule",
    "Task",
    "TaskCall",
    "Trigger",
    "UnstorableOutcome",
    "UpstreamFailed",
    "Worker",
    "WorkerConfig",
    "WorkerError",
    "Workflow",
    "broadcast",
    "current",
    "default_backoff",
    "password_of",
    "redact",
    "redact_password",
    "request_cancel",
    "request_cancel_sync",
    "requeue",
    "requeue_sync",
    "run_schedules",
]
