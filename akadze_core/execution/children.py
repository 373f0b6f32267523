"""What the process pool (``processes``) keeps of its children: a run handed to it, a child
and the runs sent to it, how a run can end without an answer (``ProcessLost``,
``NotStarted``, ``Terminated``), and how a child's end is told in the log."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model.errors import AkadzeError
from ..model.outcomes import Outcome

__all__ = ["Child", "NotStarted", "ProcessLost", "ProcessPoolError", "Run", "Terminated",
           "describe_exit", "signal_name"]


class ProcessPoolError(AkadzeError):
    """The pool could not start its processes (the child's own error is on stderr)."""


class ProcessLost(Exception):
    """The process running the body died before it answered."""


class NotStarted(Exception):
    """The job was dropped while it waited for a process: its body never started."""


class Terminated(Exception):
    """The process running the body was ended by the signal a terminate request sent."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


#: ``ProcessPool.submit``'s callback: (row, outcome, error), error an internal one.
Done = Callable[[Mapping[str, Any], "Outcome | None", "Exception | None"], None]


@dataclass(slots=True)
class Run:
    """A job handed to the pool: waiting for a process, or sent to one. Its end goes to
    ``future`` (``ProcessPool.run``), else to ``done`` (``ProcessPool.submit``)."""

    row: Mapping[str, Any]
    worker_id: int | None
    timeout: float | None
    future: asyncio.Future[Outcome | None] | None
    soft: float | None = None  # the soft limit: soft_signal is sent to the child then
    terminate: int | None = None  # a terminate request's signal, heard before it started
    done: Done | None = None
    app: Any = None  # the App of a submitted run (its lost outcome is the pool's to make)
    ended: bool = False  # its end was told, or it was cancelled: nothing more is told


@dataclass
class Child:
    """A child process of the pool, and the runs it was sent."""

    number: int
    process: subprocess.Popen[bytes]
    reader: asyncio.StreamReader
    writer: asyncio.WriteTransport
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    # The runs sent to it, in order: the first is running, the others wait in its pipe.
    sent: collections.deque[Run] = field(default_factory=collections.deque)
    # The runs sent in this turn of the event loop (the end of ``sent``), written together
    # at its end as one message.
    outbox: list[Run] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    soft_timer: asyncio.TimerHandle | None = None
    run_since: float = 0.0  # when the running one (the first sent) started
    timed_out: float | None = None  # the timeout that ended it
    terminated: int | None = None  # the signal sent to end the running one (terminate)
    # The signal sent for a run that answered anyway: it finished just before the signal
    # landed (or survived it). If the process then dies of that signal, the run it was on
    # (sent behind, started a moment ago) was not the one meant, and runs again elsewhere.
    stray_signal: int | None = None
    retiring: bool = False
    # Set once the child said it is ready: before that, its exit is its start's failure,
    # which the spawn reports, not an idle death to replace.
    ready: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.sent)



def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int | None) -> str:
    """How a child ended, for a log line: the signal that ended it, else its exit code."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was ended by {signal.Signals(-code).name}"
    return f"exited with code {code}"
