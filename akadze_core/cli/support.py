"""Process plumbing shared by the ``akadze`` and ``akadze-compat`` commands: the scrubbing
of passwords, the scrubbing log formatter, stderr logging, the click group whose failures
are one line, and the exit that does not wait for task threads."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, NoReturn

import click

from ..model.dsn import BY_SUBSTRINGS, password_of
from ..model.dsn import redact as redact_dsn
from .stdio import (
    ScrubbedOutput,
    StderrHandler,
    cache_pid_in_log_records,
    flush_held_log_lines,
    scrubbed_stdio,
)

__all__ = ["OneLineErrorGroup", "ScrubbedOutput", "ScrubbingFormatter", "Secrets", "StderrHandler",
           "cache_pid_in_log_records", "exit_now", "flush_held_log_lines", "logging_to_stderr",
           "one_line", "scrubbed_stdio"]

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


# Every control character: C0 (ESC, BEL, CR, ...), DEL and C1 (CSI and OSC as one byte).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
_HIGH_CONTROL = re.compile(r"[\x7f-\x9f]")
# The ASCII characters of _CONTROL_BUT_NEWLINE.
_ASCII_CONTROL_BUT_NEWLINE = bytes([*range(0x0a), *range(0x0b, 0x20), 0x7f])


def printable(value: Any, *, lines: bool = False, json_text: bool = False) -> str:
    """``str(value)`` safe to print on a terminal: every control character written as its
    Python escape (``\\x1b``, ``\\r``, ``\\n``), so names and messages taken from rows show
    what they hold instead of retitling the window, writing the clipboard (OSC 52) or
    rewriting lines. ``lines``: newlines are kept (a traceback, a table). ``json_text``:
    ``value`` is JSON text; DEL and C1, the only controls ``json.dumps`` leaves raw, are
    written as ``\\u00XX`` so that it stays valid JSON."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case, scanned in C: no control character
        return text
    if json_text:
        return _HIGH_CONTROL.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
    pattern = _CONTROL_BUT_NEWLINE if lines else _CONTROL
    if pattern.search(text) is None:
        return text
    return pattern.sub(lambda match: repr(match.group())[1:-1], text)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(text.split())


class Secrets:
    """The passwords an invocation saw, scrubbed from every line it prints or logs.

    ``redactors`` are further scrubbers run after the passwords (the core adds each loaded
    app's ``redact``, which knows the passwords of the app's own URLs).
    """

    def __init__(self) -> None:
        self.passwords: set[str] = set()
        self.redactors: list[Callable[[str], str]] = []

    def clear(self) -> None:
        """Forget every password and redactor (a new invocation in the same process)."""
        self.passwords.clear()
        self.redactors.clear()

    def add_url(self, url: Any) -> None:
        """Remember the password of ``url`` (a URL or key/value DSN), if it has one."""
        if isinstance(url, str) and url:
            password = password_of(url)
            if password:
                self.passwords.add(password)

    def add_environment(self, names: Iterable[str]) -> None:
        """Remember the passwords of the URLs in the environment variables ``names``."""
        for name in names:
            self.add_url(os.environ.get(name))

    def scrub(self, text: str) -> str:
        """``text`` without any known password (URL-shaped ones are masked anyway)."""
        text = redact_dsn(text)  # redact_password(text, None), a call fewer a line
        # Longest first, so a password that contains another one is replaced whole.
        if self.passwords:
            for password in sorted(self.passwords, key=len, reverse=True):
                if password in text:
                    text = text.replace(password, "***")
        for redact in self.redactors:
            text = redact(text)
        return text

    def scrub_lines(self, texts: list[str]) -> list[str]:
        """``scrub`` of each of ``texts``. What the DSN shapes and the passwords need is
        looked for once in all of them: a worker scrubs a line per job, and in almost none
        is there any. Each redactor still sees each text alone, the texts one redactor
        after the other, but for one marked ``by_substrings`` (an app's ``redact``) that
        leaves their join as it is: it would leave each of them so too."""
        whole = "\n".join(texts)
        # A needle without a newline is in one of the texts exactly when it is in their
        # join: when none is, redact_dsn and the passwords leave every text as it is.
        if (("/" in whole and "://" in whole) or "=" in whole
                or any(password in whole for password in self.passwords)):
            return [self.scrub(text) for text in texts]
        texts = list(texts)
        for redact in self.redactors:  # each text through each redactor, in their order
            if getattr(redact, BY_SUBSTRINGS, False) and redact(whole) == whole:
                continue
            texts = [redact(text) for text in texts]
            whole = "\n".join(texts)
        return texts


#: The fields of the records a logger makes at one level, in one thread and at one time,
#: that are the same in each whatever the message (their caller's file and line, and their
#: ``relativeCreated``, are not: ``ScrubbingFormatter.message_lines``).
SHARED_FIELDS = frozenset({"name", "levelno", "levelname", "asctime", "created", "msecs",
                           "process", "processName", "thread", "threadName", "message"})
# A field a %-style format names.
_FIELD = re.compile(r"%\((\w+)\)")


class ScrubbingFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose finished text (messages of other libraries, exception
    text and tracebacks included) goes through ``secrets.scrub``."""

    # (second, its text): strftime and localtime were a fifth of each line's cost, and a
    # worker logs a line per job; the text of a second never changes. One attribute, so
    # threads logging at once read a matching pair.
    _second: tuple[int, str] = (-1, "")
    # (format, the fields it names), for message_lines.
    _fields: tuple[str | None, frozenset[str]] = (None, frozenset())

    def __init__(self, secrets: Secrets, fmt: str | None = None,
                 datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, scrubbed, its control characters (but newlines) escaped:
        lines quote task and queue names from rows, and tasks' own output."""
        return printable(self.secrets.scrub(super().format(record)), lines=True)

    def message_lines(self) -> Callable[[logging.LogRecord, list[str]], list[str]] | None:
        """``lines(record, messages)``: the lines ``format`` makes of ``record`` (one without
        exception or stack) with each of ``messages`` in turn as its message, the time
        formatted once; or None when those would not be ``format``'s lines for records
        made one by one: a subclass formatting its own way (Celery's task formatter fills
        fields per record), or a format naming a field not in ``SHARED_FIELDS`` (every
        record has those, so the style's defaults never apply)."""
        cls = type(self)
        style = self._style
        if (cls.format is not ScrubbingFormatter.format
                or cls.formatMessage is not logging.Formatter.formatMessage
                or cls.usesTime is not logging.Formatter.usesTime
                or type(style) is not logging.PercentStyle):
            return None
        fields = self._fields
        if fields[0] is not style._fmt:
            fields = self._fields = (style._fmt, frozenset(_FIELD.findall(style._fmt)))
        return self._message_lines if fields[1] <= SHARED_FIELDS else None

    def _message_lines(self, record: logging.LogRecord, messages: list[str]) -> list[str]:
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        values = record.__dict__
        fmt = self._style._fmt
        around = _around_message(fmt, values)
        if around is not None:
            # The other fields are the same in every line: the format applied once.
            before, after = around
            lines = [before + message + after for message in messages]
            values["message"] = messages[-1]
        else:
            lines = []
            for message in messages:
                values["message"] = message
                lines.append(fmt % values)
        lines = self.secrets.scrub_lines(lines)
        # Checked once for them all: printable leaves a text without a control character
        # (but newlines) as it is, and the join has one exactly when a line has.
        whole = "".join(lines)
        if whole.isascii():
            # Deleting bytes is a table lookup each, a third of isprintable's cost.
            raw = whole.encode("ascii")
            if len(raw.translate(None, _ASCII_CONTROL_BUT_NEWLINE)) == len(raw):
                return lines
        elif whole.isprintable():
            return lines
        return [printable(line, lines=True) for line in lines]

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """``logging.Formatter.formatTime``'s text, the seconds part made once a second."""
        if datefmt is not None or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached = self._second
        if cached[0] != second:
            cached = self._second = (
                second, time.strftime(self.default_time_format, self.converter(second)))
        return self.default_msec_format % (cached[1], record.msecs)


# Two messages no record holds, to find where a format puts the message.
_MARKERS = ("\x00akadze-message-a\x00", "\x00akadze-message-b\x00")


def _around_message(fmt: str, values: dict[str, Any]) -> tuple[str, str] | None:
    """What ``fmt % values`` writes before and after the message, when the message is
    written as it is: the format names it once, as a plain ``%(message)s`` (no width, no
    precision), and it comes out once, in the same place for two different messages.
    None otherwise (then each line is formatted whole)."""
    if fmt.count("%(message)") != 1 or "%(message)s" not in fmt:
        return None
    parts = []
    for marker in _MARKERS:
        values["message"] = marker
        text = fmt % values
        if text.count(marker) != 1:
            return None
        parts.append(tuple(text.split(marker)))
    return (parts[0][0], parts[0][1]) if parts[0] == parts[1] else None


@contextlib.contextmanager
def logging_to_stderr(level: str | int, formatter: logging.Formatter) -> Iterator[None]:
    """Send every log record (the tasks' own included) to stderr through ``formatter``, at
    ``level`` and above. Undone on exit, so in-process callers (tests, embedding code) get
    their logging back."""
    root = logging.getLogger()
    handler = StderrHandler()
    handler.setFormatter(formatter)
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(level)
    undo = cache_pid_in_log_records()
    try:
        yield
    finally:
        undo()
        root.removeHandler(handler)
        handler.close()  # writes the lines held for the end of a loop turn
        root.setLevel(previous_level)


class OneLineErrorGroup(click.Group):
    """A click group whose failures print one ``<prog>: error: ...`` line (scrubbed) instead
    of usage text or a traceback. A subclass names ``prog_name`` and its ``secrets``, and
    may override ``begin`` (per invocation) and ``report`` (any other exception)."""

    prog_name: ClassVar[str] = "akadze"
    secrets: ClassVar[Secrets]
    #: The exit code after Ctrl-C at a prompt.
    abort_exit_code: ClassVar[int] = 130
    #: Whether a usage error's message is joined onto one line too. ``akadze-compat`` prints
    #: click's usage text as it comes (scrubbed), as it always has.
    join_usage_errors: ClassVar[bool] = True

    def begin(self, args: Sequence[str] | None, extra: dict[str, Any]) -> None:
        """Called first on every invocation (e.g. to reset the secrets); may change the
        keywords ``extra`` passed on to ``click.Group.main``."""

    @classmethod
    def error_line(cls, message: str, *, join: bool = True) -> str:
        """The one error line for ``message``: prefixed, scrubbed, and on one line unless
        ``join`` is false. A classmethod, so that code outside an invocation (a worker's
        last error) prints the same line."""
        text = one_line(message) if join else message
        # Messages may quote names from rows: no control character reaches the terminal.
        return f"{cls.prog_name}: error: {printable(cls.secrets.scrub(text), lines=not join)}"

    def report(self, exc: Exception) -> int:
        """Print the one line for an exception click does not know; returns the exit code."""
        click.echo(self.error_line(f"unexpected {type(exc).__name__}: {exc}"), err=True)
        return 1

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command; in standalone mode, exit with one line on any expected error."""
        self.begin(args, extra)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            click.echo(f"{self.prog_name}: aborted", err=True)
            sys.exit(self.abort_exit_code)
        except click.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
            line = self.error_line(exc.format_message(), join=self.join_usage_errors)
            click.echo(line + hint, err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(self.error_line(exc.format_message()), err=True)
            sys.exit(exc.exit_code)
        except BrokenPipeError:
            # `akadze jobs list | head`: the reader left; that is not an error.
            with contextlib.suppress(OSError):
                sys.stderr.close()
            sys.exit(0)
        except Exception as exc:
            sys.exit(self.report(exc))
        sys.exit(code if isinstance(code, int) else 0)
