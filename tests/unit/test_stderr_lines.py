"""The worker's stderr handler writes the log lines of one event-loop turn in one ``write``
and loses none of them: on a normal stop, a fatal error, a task's print in between."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from akadze_core.cli.support import ScrubbedOutput, StderrHandler, logging_to_stderr


class Recorder:
    """A stream that keeps each ``write`` apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(self.writes)


def capture(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """``sys.stderr`` replaced by a ``Recorder`` (in the test's body: pytest's own capture
    sets ``sys.stderr`` after the fixtures)."""
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    return recorder


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """A logger of its own with a ``StderrHandler``, closed afterwards."""
    logger = logging.getLogger("akadze.test.stderr_lines")
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_the_lines_of_one_loop_turn_go_out_in_one_write(
        logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)

    async def main() -> None:
        for n in range(3):
            logger.info("job %d succeeded", n)
        assert stderr.writes == []  # held until the turn ends
        await asyncio.sleep(0)
        assert stderr.writes == ["job 0 succeeded\njob 1 succeeded\njob 2 succeeded\n"]
        logger.info("next turn")
        await asyncio.sleep(0)
        assert stderr.writes[1:] == ["next turn\n"]

    asyncio.run(main())


def test_a_line_off_the_loop_is_written_at_once_after_the_held_ones(
        logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)
    logger.info("no loop")
    assert stderr.writes == ["no loop\n"]

    async def main() -> None:
        logger.info("on the loop")
        thread = threading.Thread(target=logger.info, args=("from a task thread",))
        thread.start()
        thread.join()
        assert stderr.writes[1:] == ["on the loop\nfrom a task thread\n"]

    asyncio.run(main())


def test_a_print_through_the_scrubbed_stream_comes_after_the_lines_held(
        logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)
    scrubbed = ScrubbedOutput(stderr, lambda text: text.replace("hunter2", "***"))
    monkeypatch.setattr(sys, "stderr", scrubbed)

    async def main() -> None:
        logger.info("before")
        print("printed hunter2", file=sys.stderr)
        logger.info("after")

    asyncio.run(main())
    assert stderr.text == "before\nprinted ***\nafter\n"


def test_held_lines_are_written_on_flush_and_close_when_the_loop_never_turns_again(
        logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)
    loop = asyncio.new_event_loop()

    async def log_and_stop() -> None:
        logger.info("the last line")
        loop.stop()  # the turn that would write it never runs

    try:
        task = loop.create_task(log_and_stop())
        loop.run_forever()
        assert task.done()
    finally:
        loop.close()
    assert stderr.writes == []
    logger.handlers[0].flush()  # logging.shutdown at exit does this
    assert stderr.writes == ["the last line\n"]


def test_nothing_is_lost_when_a_worker_dies_of_an_error_under_logging_to_stderr(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)

    async def fail() -> None:
        for n in range(2):
            logging.getLogger("akadze.worker").error("line %d", n)
        raise RuntimeError("fatal")

    with pytest.raises(RuntimeError, match="fatal"), \
            logging_to_stderr("INFO", logging.Formatter("%(message)s")):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(fail())
        finally:
            loop.close()  # drops the turn's end, as a loop torn down at once would
    assert stderr.text == "line 0\nline 1\n"


def test_a_loop_in_another_thread_writes_its_own_lines_at_once(
        logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = capture(monkeypatch)

    async def other() -> None:
        logger.info("other loop")

    async def main() -> None:
        logger.info("main loop")
        thread = threading.Thread(target=asyncio.run, args=(other(),))
        thread.start()
        thread.join()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert stderr.text == "main loop\nother loop\n"
