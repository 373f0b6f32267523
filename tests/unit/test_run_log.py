"""The worker's line per outcome (``run_log.log_outcomes``): pure logic, no database."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from akadze_core.cli.base import LOG_FORMAT, SECRETS, CommandFormatter
from akadze_core.cli.support import StderrHandler, cache_pid_in_log_records
from akadze_core.model.outcomes import RETRY, SUCCESS, Outcome
from akadze_core.worker import run_log
from akadze_core.worker.run_log import Run, log_outcomes


def _finished(job_id: int) -> dict[tuple[int, int], Run]:
    future = cast("asyncio.Task[None]", None)
    return {(job_id, 1): Run(job_id, 1, "default", "t.quick", 1, 3, time.monotonic(), future)}


def _log_one(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[Any]:
    rows = [{"id": 7, "run_count": 1, "state": "succeeded"}]
    log_outcomes([Outcome(7, 1, SUCCESS)], rows, _finished(7), level, str, None)
    return [record for record in caplog.records if record.name == "akadze.worker"]


def test_the_line_of_a_success_is_the_record_logger_log_makes(
        caplog: pytest.LogCaptureFixture) -> None:
    # Made without findCaller, but with what it would find: this module's function and line.
    caplog.set_level(logging.INFO, logger="akadze.worker")
    [record] = _log_one(caplog)
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("job 7 t.quick succeeded in ")
    assert record.getMessage().endswith("s (attempt 1, success)")
    assert record.funcName == "log_outcomes"
    assert record.pathname == run_log.log_outcomes.__code__.co_filename
    assert record.module == "run_log"
    first = run_log.log_outcomes.__code__.co_firstlineno
    assert first < record.lineno < first + 60


def test_caller_information_off_is_honoured(caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging, "_srcfile", None)
    caplog.set_level(logging.INFO, logger="akadze.worker")
    [record] = _log_one(caplog)
    assert (record.funcName, record.lineno) == ("(unknown function)", 0)


def test_no_line_below_the_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="akadze.worker")
    assert _log_one(caplog, logging.DEBUG) == []


def test_a_filter_on_the_logger_still_applies(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="akadze.worker")
    logger = logging.getLogger("akadze.worker")
    drop = logging.Filter("nothing")
    logger.addFilter(drop)
    try:
        assert _log_one(caplog) == []
    finally:
        logger.removeFilter(drop)



# --- the lines written without records, when only the CLI's stderr handler would see them ---

NOW = 1_764_583_200.5  # time.time(), fixed: each record's and the one batch time agree


def _stamp() -> str:
    """NOW as the formatter writes it: in local time, which another test may have moved (TZ)."""
    return time.strftime("%Y-%m-%d %H:%M:%S,500", time.localtime(NOW))


class Stderr:
    """``sys.stderr`` for a test, the handlers of ``akadze.worker``, and how many records
    the ``StderrHandler`` emitted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, handler: StderrHandler) -> None:
        self.text = io.StringIO()
        self.emitted = 0
        self.monkeypatch = monkeypatch
        self.handlers: list[logging.Handler] = [handler]

    def log_mixed(self) -> bool:
        """``_log_mixed`` with stderr here and ``handlers`` only on ``akadze.worker`` (set in
        the test's body: pytest sets ``sys.stderr`` after the fixtures, and adds its capture
        handler to non-propagating loggers); returns whether the lines went without records."""
        self.monkeypatch.setattr(sys, "stderr", self.text)
        self.monkeypatch.setattr(run_log.logger, "handlers", list(self.handlers))
        offered = run_log._line_writer(logging.INFO) is not None
        _log_mixed()
        return offered


@pytest.fixture
def cli_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stderr]:
    """``akadze.worker`` logging as the CLI sets it up (a ``StderrHandler``, the command's
    formatter, the cached pid), on the logger itself, not propagated; time stands still."""
    handler = StderrHandler()
    handler.setFormatter(CommandFormatter(LOG_FORMAT))
    stderr = Stderr(monkeypatch, handler)
    emit = StderrHandler.emit

    def counted(self: StderrHandler, record: logging.LogRecord) -> None:
        stderr.emitted += 1
        emit(self, record)

    monkeypatch.setattr(StderrHandler, "emit", counted)
    monkeypatch.setattr(run_log.logger, "propagate", False)
    level = run_log.logger.level
    run_log.logger.setLevel(logging.INFO)
    undo = cache_pid_in_log_records()
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)
    SECRETS.add_url("postgresql://u:hunter2@db/x")
    try:
        yield stderr
    finally:
        SECRETS.clear()
        undo()
        run_log.logger.setLevel(level)
        handler.close()


def _log_mixed() -> None:
    """A batch of successes around a retried failure and a rejected outcome; task names with
    a password and a control character in them."""
    outcomes = [Outcome(1, 1, SUCCESS), Outcome(2, 1, SUCCESS),
                Outcome(3, 1, RETRY, delay=2.0,
                        error=json.dumps({"type": "ValueError", "message": "bad"})),
                Outcome(4, 1, SUCCESS), Outcome(5, 1, SUCCESS), Outcome(6, 1, SUCCESS)]
    rows = [{"id": job, "run_count": 1, "state": state}
            for job, state in ((1, "succeeded"), (2, "succeeded"), (3, "queued"),
                               (5, "succeeded"), (6, "succeeded"))]
    tasks = {1: "t.quick", 2: "t.hunter2", 3: "t.flaky", 4: "t.gone", 5: "t.\x1bquick",
             6: "t.quick"}
    finished = {(job, 1): Run(job, 1, "default", task, 1, 3, 999.75)
                for job, task in tasks.items()}
    log_outcomes(outcomes, rows, finished, logging.INFO, str, None)


def test_the_lines_written_without_records_are_the_records_lines(
        cli_logging: Stderr, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same bytes in the same order (the failure's and the rejection's lines, records
    # both, between the successes'); only those two were records.
    assert cli_logging.log_mixed()
    fast = cli_logging.text.getvalue()
    assert cli_logging.emitted == 2
    cli_logging.text.seek(0)
    cli_logging.text.truncate()
    monkeypatch.setattr(run_log, "_line_writer", lambda level: None)
    assert not cli_logging.log_mixed()
    assert cli_logging.emitted == 2 + 6
    assert fast == cli_logging.text.getvalue()
    assert fast.splitlines() == [
        f"{_stamp()} INFO akadze.worker: job 1 t.quick succeeded in 0.250000s "
        "(attempt 1, success)",
        f"{_stamp()} INFO akadze.worker: job 2 t.*** succeeded in 0.250000s "
        "(attempt 1, success)",
        f"{_stamp()} INFO akadze.worker: job 3 t.flaky failed attempt 1/3 in "
        "0.250000s: ValueError: bad (retry in 2.0s)",
        f"{_stamp()} WARNING akadze.worker: job 4 t.gone: outcome of run 1 "
        "rejected, the run no longer owns the job",
        f"{_stamp()} INFO akadze.worker: job 5 t.\\x1bquick succeeded in "
        "0.250000s (attempt 1, success)",
        f"{_stamp()} INFO akadze.worker: job 6 t.quick succeeded in 0.250000s "
        "(attempt 1, success)"]


def test_a_success_line_written_without_a_record_is_succeededs_text(
        cli_logging: Stderr, monkeypatch: pytest.MonkeyPatch) -> None:
    # The common line is made in one f-string beside SUCCEEDED: the same text, a task name
    # ending in blanks (the label drops them) and an attempt past the first included.
    def log() -> str:
        cli_logging.monkeypatch.setattr(sys, "stderr", cli_logging.text)
        cli_logging.monkeypatch.setattr(run_log.logger, "handlers",
                                        list(cli_logging.handlers))
        outcomes = [Outcome(1, 1, SUCCESS), Outcome(2, 2, SUCCESS, result="1")]
        rows = [{"id": 1, "run_count": 1, "state": "succeeded"},
                {"id": 2, "run_count": 2, "state": "succeeded"}]
        finished = {(1, 1): Run(1, 1, "default", "t.padded  ", 1, 3, 999.75),
                    (2, 2): Run(2, 2, "default", "t.quick", 2, 3, 999.5)}
        log_outcomes(outcomes, rows, finished, logging.INFO, str, None)
        text = cli_logging.text.getvalue()
        cli_logging.text.seek(0)
        cli_logging.text.truncate()
        return text

    fast = log()
    assert cli_logging.emitted == 0
    monkeypatch.setattr(run_log, "_line_writer", lambda level: None)
    assert log() == fast
    assert cli_logging.emitted == 2
    assert fast.splitlines() == [
        f"{_stamp()} INFO akadze.worker: job 1 t.padded succeeded in 0.250000s "
        "(attempt 1, success)",
        f"{_stamp()} INFO akadze.worker: job 2 t.quick succeeded in 0.500000s "
        "(attempt 2, success)"]


def test_the_lines_are_held_for_the_loop_turn_as_records_are(cli_logging: Stderr) -> None:
    async def log_then_look() -> str:
        assert cli_logging.log_mixed()
        held = cli_logging.text.getvalue()
        await asyncio.sleep(0)
        return held

    assert asyncio.run(log_then_look()) == ""
    assert len(cli_logging.text.getvalue().splitlines()) == 6


@pytest.mark.parametrize("messages", [
    ["job 1 t.quick succeeded", "job 22 t.\x1bq (attempt 1, success)", "",
     "100% postgresql://u:hunter2@db/x"],
    # Nothing to scrub or escape in any line, then in one line only (the checks made
    # once for all the lines find it there), a newline kept, a line not printable
    # without a control character.
    ["job 1 t.quick succeeded", "job 2 t.quick succeeded"],
    ["job 1 t.quick succeeded", "job 2 t.\x9bq succeeded", "job 3 t.quick"],
    ["job 1 t.quick succeeded", "job 2 says hunter2", "job 3 t.quick"],
    ["job 1 t.quick\nsucceeded", "job 2 t.\u2028q", "job 3 password=x"],
    ["job 1 t.quick\nsucceeded", "job 2 t.\x7fq", "job 3 t.\x1fq"],
    ["job 1 t.quick\nsucceeded", "job 2 t.quick", "job 3 t.\u00e9"],
])
@pytest.mark.parametrize("fmt", [
    LOG_FORMAT, "%(message)s", "%(asctime)s [%(message)s] %(levelname)s",
    "%(message)-40s|%(levelname)s", "%(levelname)s %(message).10s", "%%(message)s %(message)s",
    "%(message)s / %(message)s", "100%% %(name)s: %(message)s"])
def test_the_lines_of_one_record_are_its_format_with_each_message(
        fmt: str, messages: list[str]) -> None:
    # message_lines formats the fields but the message once where the message goes in
    # as it is; any other format of it (a width, a precision, twice) still gives format's.
    formatter = CommandFormatter(fmt)
    lines = formatter.message_lines()
    assert lines is not None
    SECRETS.add_url("postgresql://u:hunter2@db/x")
    try:
        record = logging.LogRecord("akadze.worker", logging.INFO, __file__, 0, "x", None,
                                   None)
        made = lines(record, messages)
        expected = []
        for message in messages:
            one = logging.LogRecord("akadze.worker", logging.INFO, __file__, 0, message, None,
                                    None)
            one.created, one.msecs = record.created, record.msecs
            expected.append(formatter.format(one))
    finally:
        SECRETS.clear()
    assert made == expected
    assert "hunter2" not in "".join(made)


class Kept(logging.Handler):
    """A handler of the user's: the records it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _user_handler(stderr: Stderr,
                  monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    kept = Kept()
    stderr.handlers.append(kept)
    return kept.records


def _handler_filter(stderr: Stderr,
                    monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    seen: list[logging.LogRecord] = []
    stderr.handlers[0].addFilter(lambda record: seen.append(record) or True)
    return seen


def _record_factory(stderr: Stderr,
                    monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    made: list[logging.LogRecord] = []
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made.append(make(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(logging, "_logRecordFactory", factory)
    return made


def _wrapped_call_handlers(stderr: Stderr,
                           monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    # What Sentry's logging integration does: every record passes through its wrapper.
    seen: list[logging.LogRecord] = []
    call = logging.Logger.callHandlers

    def wrapped(self: logging.Logger, record: logging.LogRecord) -> None:
        seen.append(record)
        call(self, record)

    monkeypatch.setattr(logging.Logger, "callHandlers", wrapped)
    return seen


def _formatter_of_its_own(stderr: Stderr,
                          monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    seen: list[logging.LogRecord] = []

    class Formatter(CommandFormatter):
        def format(self, record: logging.LogRecord) -> str:
            seen.append(record)
            return super().format(record)

    stderr.handlers[0].setFormatter(Formatter(LOG_FORMAT))
    return seen


@pytest.mark.parametrize("install", [_user_handler, _handler_filter, _record_factory,
                                     _wrapped_call_handlers, _formatter_of_its_own])
def test_whatever_else_would_see_the_records_still_gets_every_one(
        cli_logging: Stderr, monkeypatch: pytest.MonkeyPatch,
        install: Callable[[Stderr, pytest.MonkeyPatch], list[logging.LogRecord]]) -> None:
    seen = install(cli_logging, monkeypatch)
    assert not cli_logging.log_mixed()
    assert [record.getMessage().split(" ")[1] for record in seen
            if record.name == "akadze.worker"] == ["1", "2", "3", "4", "5", "6"]
    assert len(cli_logging.text.getvalue().splitlines()) == 6
