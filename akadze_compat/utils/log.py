"""Logging helpers of Celery's ``celery.utils.log``: ``get_task_logger`` above all.

Loggers keep Celery's hierarchy so logging configurations written for Celery still apply:
every logger handed out here sits below the ``"celery"`` logger, and task loggers below
``"celery.task"``. A task module's logger keeps its own name (``get_task_logger(__name__)``
gives ``"proj.tasks"``), but its *parent* is moved to ``"celery.task"``, so the levels and
handlers set on ``"celery.task"`` and ``"celery"`` govern it.

Provided: ``get_task_logger``, ``get_logger``, ``base_logger``, ``task_logger``,
``worker_logger``, ``mlevel``, ``LOG_LEVELS``. Not provided: Celery's worker-internal
helpers (``ColorFormatter``, ``LoggingProxy``, ``in_sighandler``, ``set_in_sighandler``,
the multiprocessing-logger functions).
"""

from __future__ import annotations

import logging
import numbers

__all__ = (
    "LOG_LEVELS",
    "base_logger",
    "get_logger",
    "get_task_logger",
    "mlevel",
    "task_logger",
    "worker_logger",
)

#: Level names to numbers and numbers to names, like kombu's table that Celery re-exports
#: (built from the standard levels; levels added later with addLevelName are not in it).
LOG_LEVELS: dict[str | int, str | int] = {
    "CRITICAL": logging.CRITICAL,
    "FATAL": logging.FATAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARN,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "NOTSET": logging.NOTSET,
    logging.CRITICAL: "CRITICAL",
    logging.ERROR: "ERROR",
    logging.WARNING: "WARNING",
    logging.INFO: "INFO",
    logging.DEBUG: "DEBUG",
    logging.NOTSET: "NOTSET",
}

#: Names a task logger may not take: they are the roots of the hierarchy itself.
RESERVED_LOGGER_NAMES = frozenset({"celery", "celery.task"})


def _named_logger(name: str | logging.Logger) -> logging.Logger:
    """The logger called ``name``, given a NullHandler if it has no handler yet.

    The NullHandler is what Celery (through kombu) does: without it, a record reaching
    no handler at all would be printed by logging's last-resort handler.
    """
    logger = logging.getLogger(name) if isinstance(name, str) else name
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def _descends_from(logger: logging.Logger, ancestor: logging.Logger) -> bool:
    """Whether ``ancestor`` is ``logger`` or one of its parents."""
    seen: set[int] = set()
    current: logging.Logger | None = logger
    while current is not None:
        if current is ancestor:
            return True
        if id(current) in seen:
            raise RuntimeError(f"Logger {logger.name!r} has a cycle in its parents")
        seen.add(id(current))
        current = current.parent
    return False


def _place_under(parent: logging.Logger, logger: logging.Logger) -> logging.Logger:
    """Make ``parent`` the parent of ``logger`` unless it is already an ancestor."""
    if not _descends_from(logger, parent):
        logger.parent = parent
    return logger


#: The root of the hierarchy, the ``"celery"`` logger.
base_logger: logging.Logger = _named_logger("celery")


def get_logger(name: str | logging.Logger) -> logging.Logger:
    """Return the logger ``name``, attached below the ``"celery"`` logger.

    As in Celery, a logger whose parent is the root logger (a top-level name such as
    ``"proj"``, or a dotted name none of whose ancestors exist yet) is left where it is.
    """
    logger = _named_logger(name)
    if logging.root in (logger, logger.parent) or logger is base_logger:
        return logger
    return _place_under(base_logger, logger)


#: The parent of every task logger, ``"celery.task"``.
task_logger: logging.Logger = get_logger("celery.task")
#: The worker's logger, ``"celery.worker"``.
worker_logger: logging.Logger = get_logger("celery.worker")


def get_task_logger(name: str) -> logging.Logger:
    """Return the logger for a task module (usually ``get_task_logger(__name__)``).

    The logger keeps ``name`` but is attached below ``"celery.task"``. Raises
    ``RuntimeError`` for ``"celery"`` and ``"celery.task"``, which are reserved.
    """
    if name in RESERVED_LOGGER_NAMES:
        raise RuntimeError(f"Logger name {name!r} is reserved!")
    return _place_under(task_logger, get_logger(name))


def mlevel(level: int | str | None) -> int | str | None:
    """Turn a level name (any case, e.g. ``"info"``) into its number; numbers pass through."""
    if level and not isinstance(level, numbers.Integral):
        return LOG_LEVELS[str(level).upper()]
    return level
