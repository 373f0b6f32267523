"""akadze_core: a Postgres-backed job queue.

Jobs are rows; workers claim them with ``FOR UPDATE SKIP LOCKED``, heartbeat, rescue each
other's lost jobs, and write outcomes fenced by ``run_count`` and the claim's random token so
a late run never wins.
"""

from .app import App
from .enqueue.nodes import Node, OnFailure
from .enqueue.tasks import Task, TaskCall
from .enqueue.workflow import Workflow
from .execution.context import JobContext, current
from .model.dsn import password_of, redact, redact_password
from .model.errors import (
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
from .model.jobs import Job
from .model.retry import BackoffPolicy, default_backoff
from .ops.control import (
    ControlReply,
    broadcast,
    request_cancel,
    request_cancel_sync,
    requeue,
    requeue_sync,
)
from .schedules.runtime import RuntimeSchedules, StoredSchedule
from .schedules.scheduler import Schedule, Scheduler, ScheduleSpec, run_schedules
from .schedules.triggers import Cron, Every, Trigger
from .store.pauses import QueueState
from .worker.config import WorkerConfig
from .worker.lifecycle import Worker, WorkerError

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
    "QueueState",
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
