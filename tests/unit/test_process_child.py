"""The prefork child's wire helpers: the lines it reads and the answers it holds back."""

from __future__ import annotations

import os
import select
import time

from akadze_core.execution import process_child
from akadze_core.execution.process_child import HOLD_FOR, _Answers, _lines


def test_lines_say_whether_another_whole_line_is_already_read() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"one\ntwo\nthr")
        lines = _lines(read_fd)
        assert next(lines) == (b"one", True)
        assert next(lines) == (b"two", False)  # "thr" is no whole line: it waits for more
        os.write(write_fd, b"ee\nfour\n")
        assert next(lines) == (b"three", True)
        assert next(lines) == (b"four", False)
        os.close(write_fd)
        write_fd = -1
        assert list(lines) == []
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_held_answers_go_in_one_write_or_after_hold_for() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as writer:
        answers = _Answers(writer)
        answers.hold(b"a\n", time.perf_counter())
        answers.write(b"b\n")
        assert os.read(read_fd, 100) == b"a\nb\n"  # both in one write
        # A body that turned long: the watchdog writes what is held, the body still running.
        held_at = time.perf_counter()
        answers.hold(b"c\n", held_at)
        assert select.select([read_fd], [], [], 5.0)[0]
        waited = time.perf_counter() - held_at
        assert os.read(read_fd, 100) == b"c\n"
        assert HOLD_FOR <= waited < 1.0
        # Held answers are due before a body starts once HOLD of them wait.
        now = time.perf_counter()
        for _ in range(process_child.HOLD - 1):
            answers.hold(b"d\n", now)
        assert not answers.due(now)
        answers.hold(b"d\n", now)
        assert answers.due(now)
    os.close(read_fd)
