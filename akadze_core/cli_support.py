"""Process plumbing shared by the ``akadze`` and ``akadze-compat`` commands."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from typing import Any, NoReturn

__all__ = ["StderrHandler", "exit_now"]


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
