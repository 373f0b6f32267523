"""A worker's stderr and stdout: the log handler that writes an event-loop turn's lines in
one ``write`` (and the worker's lines per outcome without records, when only it would see
them), the records' cached process id, and the scrubbed streams what tasks print goes
through."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["ScrubbedOutput", "StderrHandler", "cache_pid_in_log_records", "flush_held_log_lines",
           "scrubbed_stdio"]

# This process's id, for log records (see cache_pid_in_log_records); a fork updates it.
_pid = os.getpid()

# The handlers holding lines for the end of their loop turn: what is written to stdout or
# stderr through a ScrubbedOutput writes these first, so a task's print() stays after the
# lines logged before it.
_holding: set[StderrHandler] = set()


def flush_held_log_lines() -> None:
    """Write out the lines every ``StderrHandler`` holds for the end of its loop turn."""
    for handler in list(_holding):
        handler.flush_lines()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at write time (test runners swap it); past a
    ``ScrubbedOutput`` in its place (log lines are scrubbed by their formatter already).

    Lines logged on a running event loop's thread are held and written together, in one
    ``write``, at the end of the loop turn (a ``call_soon``): a worker logs a line per job,
    and its completer a batch of them at once, where a ``write`` system call per line was a
    fifth to two fifths of a line's cost. Lines logged elsewhere (task threads, no loop) are
    written at once, after whatever is held. ``flush()`` and ``close()`` (so
    ``logging.shutdown`` at exit, and ``exit_now``) write the held lines, and so does any
    write through a ``ScrubbedOutput``; a process killed outright (SIGKILL) loses at most
    the lines of its current loop turn.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._held: list[str] = []
        self._held_loop: asyncio.AbstractEventLoop | None = None
        self._held_record: logging.LogRecord | None = None

    @property  # type: ignore[override]
    def stream(self) -> Any:
        stream = sys.stderr
        return stream.unscrubbed if isinstance(stream, ScrubbedOutput) else stream

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        """Format ``record``; hold its line until the end of the loop turn on a loop's
        thread, else write it (after the lines held)."""
        try:
            line = self.format(record) + self.terminator
            loop = asyncio._get_running_loop()
            if loop is not None and self._hold(loop, record):
                self._held.append(line)
                return
            self._write(line)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def line_writer(self, name: str, level: int) -> Callable[[list[str]], None] | None:
        """A writer of the lines ``emit`` would write for the records logger ``name`` makes
        at ``level`` with each of the messages it is given (each already merged with its
        arguments), written as ``emit`` writes them, without a record each; or None when
        the records are wanted: a filter on this handler, a subclass, a record factory of
        the user's (it may add to or change what a line shows), a formatter that is not a
        ``ScrubbingFormatter`` formatting a record's shared fields only (its
        ``message_lines``). The lines of one call share its time.

        For a caller that logs a line per job and has checked that this handler alone would
        see its records (the worker's line per outcome: a record is ~5 of its ~8 µs).
        """
        if type(self) is not StderrHandler or self.filters or level < self.level:
            return None
        offer = getattr(self.formatter, "message_lines", None)
        lines = offer() if offer is not None else None
        if lines is None or not _plain_records():
            return None
        return functools.partial(self._write_lines, lines, name, level)

    def _write_lines(self, lines: Callable[[logging.LogRecord, list[str]], list[str]],
                     name: str, level: int, messages: list[str]) -> None:
        # One record made for them all: the lines' shared fields (time, process, thread),
        # and what handleError reports should writing fail.
        record = logging.getLogRecordFactory()(name, level, __file__, 0, messages[0], None,
                                               None, "line_writer")
        try:
            text = self.terminator.join(lines(record, messages)) + self.terminator
            with self.lock:  # type: ignore[union-attr]
                loop = asyncio._get_running_loop()
                if loop is not None and self._hold(loop, record):
                    self._held.append(text)
                    return
                self._write(text)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _hold(self, loop: asyncio.AbstractEventLoop, record: logging.LogRecord) -> bool:
        # Held only for the loop whose turn will write them (a second loop in another
        # thread writes its own lines at once).
        if self._held_loop is loop:
            return True
        if self._held_loop is not None:
            return False
        try:
            loop.call_soon(self.flush_lines)
        except RuntimeError:  # the loop is closing
            return False
        self._held_loop, self._held_record = loop, record
        _holding.add(self)
        return True

    def _write(self, text: str) -> None:
        if self._held:
            text = "".join(self._take()) + text
        stream = self.stream
        stream.write(text)
        stream.flush()

    def _take(self) -> list[str]:
        held, self._held = self._held, []
        self._held_loop = self._held_record = None
        _holding.discard(self)
        return held

    def flush_lines(self) -> None:
        """Write the lines held for the end of the loop turn, in one ``write``."""
        with self.lock:  # type: ignore[union-attr]
            if not self._held:
                return
            record = self._held_record
            try:
                self._write("")
            except RecursionError:
                raise
            except Exception:
                self.handleError(record)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Write the lines held, then flush the stream."""
        self.flush_lines()
        super().flush()

    def close(self) -> None:
        """Write the lines held; then close as any handler."""
        self.flush_lines()
        super().close()

    def _forget(self) -> None:
        # A forked child: the parent writes what it held.
        self._held = []
        self._held_loop = self._held_record = None


class _CachedPidRecords:
    """The record factory ``cache_pid_in_log_records`` installs: ``make``'s records, their
    ``process`` from the cache."""

    def __init__(self, make: Callable[..., logging.LogRecord]) -> None:
        self.make = make

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        made = self.make(*args, **kwargs)
        made.process = _pid
        return made


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
    logging.logProcesses = False  # the factory below fills it in
    logging.setLogRecordFactory(_CachedPidRecords(make))

    def undo() -> None:
        logging.setLogRecordFactory(make)
        logging.logProcesses = True

    return undo


def _plain_records() -> bool:
    # Records as logging.LogRecord makes them (its pid from our cache or not): a factory of
    # the user's may add or change what a line shows, so it sees every record.
    factory = logging.getLogRecordFactory()
    if isinstance(factory, _CachedPidRecords):
        factory = factory.make
    return factory is logging.LogRecord


def _forked() -> None:
    global _pid
    _pid = os.getpid()
    for handler in list(_holding):
        handler._forget()
    _holding.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class ScrubbedOutput:
    """A worker's ``sys.stdout`` / ``sys.stderr``: what tasks ``print()`` goes out line by
    line through ``scrub`` (passwords removed), as the worker's log lines do.

    A line is held until its newline (a password split over two ``write`` calls, as
    ``print(a, b)`` makes, is still seen whole); a ``flush()`` writes a partial line out,
    and so does a line longer than ``LIMIT`` characters. The log lines a ``StderrHandler``
    holds for the end of its loop turn are written first.
    """

    LIMIT = 65536

    def __init__(self, stream: Any, scrub: Callable[[str], str]) -> None:
        self.unscrubbed = stream
        self._scrub = scrub
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        """Queue ``text``; write the complete lines it ends, scrubbed."""
        if _holding:
            flush_held_log_lines()
        with self._lock:
            pending = self._pending + text
            if "\n" in text:
                head, _, tail = pending.rpartition("\n")
                out, self._pending = head + "\n", tail
            elif len(pending) > self.LIMIT:
                out, self._pending = pending, ""
            else:
                self._pending = pending
                return len(text)
            self.unscrubbed.write(self._scrub(out))
        return len(text)

    def flush(self) -> None:
        """Write the partial line held, scrubbed, and flush the stream."""
        if _holding:
            flush_held_log_lines()
        with self._lock:
            pending, self._pending = self._pending, ""
            if pending:
                self.unscrubbed.write(self._scrub(pending))
        self.unscrubbed.flush()

    def writelines(self, lines: Iterable[str]) -> None:
        """``write`` each of ``lines``."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # fileno, isatty, encoding, buffer...: the stream's own.
        return getattr(self.unscrubbed, name)


@contextlib.contextmanager
def scrubbed_stdio(scrub: Callable[[str], str]) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` scrubbed by ``scrub`` until the block ends (a
    worker that ends with ``exit_now`` keeps them: it flushes them on its way out)."""
    saved = sys.stdout, sys.stderr
    sys.stdout = ScrubbedOutput(saved[0], scrub)  # type: ignore[assignment]
    sys.stderr = ScrubbedOutput(saved[1], scrub)  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved
