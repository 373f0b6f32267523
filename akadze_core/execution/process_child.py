"""The child's side of the process pool (``akadze_core.execution.processes``), and their wire
format.

Parent and child talk over two pipes, one JSON line per message, so nothing is ever
unpickled: the parent sends a claimed row (``encode_row``) or ``STOP``; the child answers
each row with how long the body took and the outcome's fields (``decode_answer``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, BinaryIO

from ..model.outcomes import Outcome
from .executor import execute_here

if TYPE_CHECKING:
    from ..app import App

__all__ = ["CHILD_ENV", "STOP", "child_number", "decode_answer", "encode_row", "is_child",
           "serve"]

logger = logging.getLogger("akadze.worker")

#: Set in a child's environment: ``"<number>:<read fd>:<write fd>"``.
CHILD_ENV = "AKADZE_PROCESS_CHILD"
#: Tells a child to exit; end of file without it means the parent died.
STOP = b'{"stop": true}\n'
#: A body shorter than this is short (the parent's ``processes.SHORT``, which imports it).
SHORT = 0.01
#: The most answers a child holds back to write together, and for how long (seconds) it
#: holds the first: the parent's time limits and its blame for a lost process run that far
#: behind (see ``_serve_lines``).
HOLD = 10
HOLD_FOR = 0.001
#: How often a child's answer watchdog looks for answers held past ``HOLD_FOR`` while a
#: body runs: what it writes were held for at most about this long (and the body's time
#: to give it the interpreter).
WATCH = SHORT
_READ_SIZE = 1 << 16
# Looks of the answer watchdog that found nothing held before it sleeps on its event.
_QUIET_POLLS = 3
_DATETIME_FIELDS = ("scheduled_at", "expires_at", "created_at", "started_at")
# An outcome's fields, in order, as one tuple: dataclasses.astuple deep-copies every field
# (a tenth of a child's time per no-op body), and the fields are plain values anyway.
_outcome_values = operator.attrgetter(*(item.name for item in fields(Outcome)))


def encode_row(row: Mapping[str, Any], worker_id: int | None,
               task_id_key: str | None = None) -> bytes:
    """The message that hands the claimed ``row`` to a child (with the database's key of
    derived task ids, so that the child never connects to read it)."""
    values = dict(row)
    for name in _DATETIME_FIELDS:
        value = values.get(name)
        if isinstance(value, datetime):
            values[name] = value.isoformat()
    return json.dumps({"row": values, "worker_id": worker_id,
                       "task_id_key": task_id_key}).encode() + b"\n"


def _decode_row(message: dict[str, Any]) -> dict[str, Any]:
    row = message["row"]
    for name in _DATETIME_FIELDS:
        value = row.get(name)
        if isinstance(value, str):
            row[name] = datetime.fromisoformat(value)
    return row


def _encode_answer(took: float, outcome: Outcome | None) -> bytes:
    answer = [took, None if outcome is None else _outcome_values(outcome)]
    return json.dumps(answer).encode() + b"\n"


def decode_answer(line: bytes) -> tuple[float, Outcome | None]:
    """A child's answer: the seconds its body took, and the outcome (None: complete_tx
    wrote it)."""
    took, values = json.loads(line)
    return float(took), None if values is None else Outcome(*values)


def is_child() -> bool:
    """Whether this process is a pool child (its command should call ``serve``)."""
    return CHILD_ENV in os.environ


def child_number() -> int:
    """This child's number in its pool (1, 2, ...; replacements get new numbers)."""
    return int(os.environ[CHILD_ENV].split(":")[0])


def serve(app: App) -> int:
    """A pool child's life: tell the parent it is ready, then run one body per message
    until the parent says stop (or dies). Returns the exit code (0)."""
    number, read_fd, write_fd = (int(part) for part in os.environ.pop(CHILD_ENV).split(":"))
    del number
    parent = os.getppid()
    # The parent decides when children stop: Ctrl-C in a terminal is for the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with os.fdopen(write_fd, "wb") as writer:
        writer.write(json.dumps({"ready": os.getpid()}).encode() + b"\n")
        writer.flush()
        try:
            stopped = _serve_lines(app, read_fd, writer)
        finally:
            os.close(read_fd)
        if not stopped:
            # End of file without a stop message: the worker process died (SIGKILL?).
            logger.warning("the worker process (pid %s) is gone: exiting", parent)
    sys.stdout.flush()
    return 0


def _lines(read_fd: int) -> Iterator[tuple[bytes, bool]]:
    """The lines the parent writes, each with whether another whole line is already here
    (read, not waited for): the child holds its answers only while it has more to run."""
    partial: list[bytes] = []
    while True:
        data = os.read(read_fd, _READ_SIZE)
        if not data:
            return
        *complete, rest = data.split(b"\n")
        if complete:
            if partial:
                complete[0] = b"".join(partial) + complete[0]
                partial.clear()
            last = len(complete) - 1
            for index, line in enumerate(complete):
                yield line, index < last
        if rest:
            partial.append(rest)


class _Answers:
    """A child's answers to the parent, held back to be written together: each write wakes
    the parent (and on a busy host lets it take the CPU from whoever ran).

    The parent starts a job's time limit at the answer of the one before, and blames a
    process's death on the first job it has no answer for, so answers are held only while
    the child runs jobs already sent behind them (short tasks'), ``HOLD`` at most, and a
    watchdog thread writes those held for ``HOLD_FOR`` (a short task's body that turned
    long) at its next look, every ``WATCH`` seconds while answers come held (it sleeps on
    an event once none do): its own wake-ups cost what the held writes save, so it looks
    seldom, and a body that is still short when it looks has not held them long.
    """

    def __init__(self, writer: BinaryIO) -> None:
        self._writer = writer
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._since = 0.0
        self._watching = False
        self._wake = threading.Event()
        threading.Thread(target=self._watch, name="akadze-answers", daemon=True).start()

    def hold(self, answer: bytes, now: float) -> None:
        """Keep ``answer`` to write with the next ones (the next job is read already)."""
        with self._lock:
            if not self._held:
                self._since = now
            self._held.append(answer)
        if not self._watching:
            self._watching = True
            self._wake.set()

    def due(self, now: float) -> bool:
        """Whether what is held must go before the next body starts."""
        return bool(self._held) and (len(self._held) >= HOLD or now - self._since >= HOLD_FOR)

    def write(self, answer: bytes | None = None) -> None:
        """Write what is held, and ``answer`` after it, in one write."""
        with self._lock:
            self._write_held(answer)

    def _write_held(self, answer: bytes | None = None) -> None:
        held = self._held
        if answer is not None:
            held.append(answer)
        if held:
            self._writer.write(held[0] if len(held) == 1 else b"".join(held))
            self._writer.flush()
            held.clear()

    def _watch(self) -> None:
        quiet = 0
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                time.sleep(WATCH)
                with self._lock:
                    if self._held:
                        quiet = 0
                        if time.perf_counter() - self._since >= HOLD_FOR:
                            with contextlib.suppress(OSError, ValueError):
                                self._write_held()
                        continue
                quiet += 1
                if quiet < _QUIET_POLLS:
                    continue
                # Nothing held for a while: sleep until hold() wakes it. Said before looking
                # again, so that an answer held meanwhile either is seen or wakes it.
                self._watching = False
                if not self._held:
                    break
                self._watching = True
            quiet = 0


def _serve_lines(app: App, read_fd: int, writer: BinaryIO) -> bool:
    """Run the parent's jobs, answering each; True when it said stop, False at end of file.

    While another job is already read (the parent sent it behind this one), a job's answer
    is held to go with the next ones (``_Answers``), unless that job's task is new here or
    its last body here was not short: a long body does not start with answers held.
    """
    answers = _Answers(writer)
    short: set[str] = set()  # tasks whose last body here took under SHORT
    for line, more in _lines(read_fd):
        message = json.loads(line)
        if message.get("stop"):
            answers.write()
            return True
        row = _decode_row(message)
        if row["task"] not in short or answers.due(time.perf_counter()):
            answers.write()
        if message.get("task_id_key"):
            app.use_task_id_key(message["task_id_key"])
        started = time.perf_counter()
        outcome = execute_here(app, row, message["worker_id"])
        ended = time.perf_counter()
        took = ended - started
        if took < SHORT:
            short.add(row["task"])
        else:
            short.discard(row["task"])
        # How long the body took tells the parent which tasks are short.
        answer = _encode_answer(took, outcome)
        if more:
            answers.hold(answer, ended)
        else:
            answers.write(answer)
    return False
