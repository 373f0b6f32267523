"""Logging for ``akadze-compat``: Celery's worker logging, with passwords scrubbed.

The worker sets logging up the way Celery's does: it sends ``setup_logging``, and when a
receiver is connected it leaves logging entirely to the project; otherwise it configures the
root logger (``worker_log_format``; handlers cleared when ``worker_hijack_root_logger``), the
``celery.task`` logger (``worker_task_log_format``, with ``task_name``/``task_id``), and
sends ``after_setup_logger`` and ``after_setup_task_logger``.
"""

from __future__ import annotations

import logging
from typing import Any

from akadze_core.integration import ScrubbingFormatter, StderrHandler, cache_pid_in_log_records

from .. import _state, signals
from .base import secrets

__all__ = ["setup_command_logging", "setup_worker_logging"]


class TaskFormatter(ScrubbingFormatter):
    """Fills ``%(task_name)s`` and ``%(task_id)s`` from the task running in this context
    (scrubbed, as every line is)."""

    def format(self, record: logging.LogRecord) -> str:
        task = _state.get_current_task()
        request = getattr(task, "request", None) if task is not None else None
        record.__dict__.setdefault("task_name", getattr(task, "name", None) or "???")
        record.__dict__.setdefault("task_id", getattr(request, "id", None) or "???")
        return super().format(record)


def _handler(logfile: str | None, formatter: logging.Formatter) -> logging.Handler:
    handler: logging.Handler = (logging.FileHandler(logfile, encoding="utf-8") if logfile
                                else StderrHandler())
    handler.setFormatter(formatter)
    return handler


def setup_worker_logging(app: Any, loglevel: int, logfile: str | None) -> bool:
    """Set logging up for a worker process; returns False when a ``setup_logging`` receiver
    took it over (then nothing here is configured, as in Celery)."""
    conf = app.conf
    log_format = conf.worker_log_format
    replies = signals.setup_logging.send(sender=None, loglevel=loglevel, logfile=logfile,
                                         format=log_format, colorize=False)
    if replies:
        for _receiver, response in replies:
            if isinstance(response, Exception):
                raise response
        return False
    root = logging.getLogger()
    if conf.worker_hijack_root_logger:
        root.handlers = []
        for name in ("celery", "celery.task", "celery.redirected"):
            logging.getLogger(name).handlers = []
    root.addHandler(_handler(logfile, ScrubbingFormatter(secrets, log_format,
                                                         conf.worker_log_datefmt)))
    root.setLevel(loglevel)
    signals.after_setup_logger.send(sender=None, logger=root, loglevel=loglevel,
                                    logfile=logfile, format=log_format, colorize=False)
    task_logger = logging.getLogger("celery.task")
    task_format = conf.worker_task_log_format
    task_logger.addHandler(_handler(logfile, TaskFormatter(secrets, task_format,
                                                           conf.worker_task_log_datefmt)))
    task_logger.setLevel(loglevel)
    task_logger.propagate = False
    signals.after_setup_task_logger.send(sender=None, logger=task_logger, loglevel=loglevel,
                                         logfile=logfile, format=task_format, colorize=False)
    cache_pid_in_log_records()  # for the worker's life: a line per task at INFO
    return True


def setup_command_logging(level: int = logging.WARNING) -> None:
    """Plain stderr logging for the commands other than ``worker``, scrubbed."""
    root = logging.getLogger()
    root.addHandler(_handler(None, ScrubbingFormatter(
        secrets, "%(asctime)s %(levelname)s %(name)s: %(message)s")))
    root.setLevel(level)
