"""Process plumbing shared by the ``akadze`` and ``akadze-compat`` commands."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["StderrHandler", "cache_pid_in_log_records", "exit_now"]

# This process's id, for log records (see cache_pid_in_log_records); a fork updates it.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def cache_pid_in_log_records() -> Callable[[], None]:
    """Make log records take the process id from a cache; returns the undo.

    ``logging.LogRecord`` calls ``os.getpid()`` for every record, a system call since glibc
    stopped caching it: 7 % of a core worker's samples at a line per job. Records still
    carry the right ``process`` (a forked child updates the cache), built by whatever
    record factory was installed. Nothing changes if process ids were turned off already.
    """
    if not logging.logProcesses:
        return lambda: None
    make = logging.getLogRecordFactory()

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = make(*args, **kwargs)
        made.process = _pid
        return made

    logging.logProcesses = False  # the factory below fills it in
    logging.setLogRecordFactory(record)

    def undo() -> None:
        logging.setLogRecordFactory(make)
        logging.logProcesses = True

    return undo


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always sys.stderr


def exit_now(code: int) -> NoReturn:
    """Leave the process with ``code`` even if a task thread is still running.

    A worker does not wait for a sync task's thread it gave up on at shutdown (a thread
    cannot be killed); a normal interpreter exit would join it and hang for as long as the
    task runs. So: run the atexit handlers ourselves (logging flush, the embedded Postgres
    stopping), flush stdio, and ``os._exit``.
    """
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
