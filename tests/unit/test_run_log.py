"""The worker's line per outcome (``run_log.log_outcomes``): pure logic, no database."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import pytest

from akadze_core.model.outcomes import SUCCESS, Outcome
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
    assert first < record.lineno < first + 40


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
