"""The CLI's log formatter writes exactly what ``logging.Formatter`` writes, and its
records carry the right process id without a system call per record."""

from __future__ import annotations

import logging
import os

from akadze_core.cli.base import LOG_FORMAT, CommandFormatter
from akadze_core.cli.support import cache_pid_in_log_records


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("akadze.worker", logging.INFO, __file__, 1,
                               "job %s succeeded", (7,), None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_lines_equal_the_stock_formatters_within_and_across_seconds() -> None:
    ours, stock = CommandFormatter(LOG_FORMAT), logging.Formatter(LOG_FORMAT)
    # Within one second, into the next, back to an earlier one (another thread's record
    # formatted late), across midnight and a year end.
    for created in (1_764_583_200.001, 1_764_583_200.999, 1_764_583_201.5, 1_764_583_200.25,
                    1_764_633_599.9995, 1_764_633_600.0, 1_767_225_599.5, 1_767_225_600.5):
        record = _record(created)
        assert ours.format(record) == stock.format(record)
        assert ours.formatTime(record, "%H:%M") == stock.formatTime(record, "%H:%M")


def test_records_carry_the_cached_pid_a_fork_updates_and_undo_restores() -> None:
    def make() -> logging.LogRecord:
        return logging.getLogger("akadze.test").makeRecord(
            "akadze.test", logging.INFO, __file__, 1, "x", (), None)

    factory = logging.getLogRecordFactory()
    undo = cache_pid_in_log_records()
    try:
        assert logging.getLogRecordFactory() is not factory
        assert make().process == os.getpid()
        child = os.fork()
        if child == 0:  # the child's records name the child
            os._exit(0 if make().process == os.getpid() else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        undo()
    assert logging.getLogRecordFactory() is factory and logging.logProcesses
    assert make().process == os.getpid()
