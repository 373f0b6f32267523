"""The process pool's wire format: the rows a parent writes to a child in one message come
back in the child as the same rows, in order, and ``STOP`` reads as the stop message."""

from __future__ import annotations

import io
import os
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from akadze_core.execution.process_child import (
    STOP,
    _decode_row,
    _read_message,
    encode_rows,
)


def _row(job_id: int, **values: Any) -> dict[str, Any]:
    at = datetime(2026, 12, 6, 22, 48, 45, 772296, tzinfo=timezone.utc)
    return {"id": job_id, "task": "app.add", "queue": "celery",
            "args": '{"args": ["line\\nbreak", "ü€😀"], "kwargs": {}}', "priority": 0,
            "scheduled_at": at, "expires_at": None, "created_at": at,
            "started_at": at + timedelta(seconds=1), "cancel_requested": False,
            "upstreams": [1, 2], "claim_token": 2 ** 60, "releases": False, "meta": None,
            **values}


def test_rows_written_at_once_are_read_back_the_same_in_order() -> None:
    paris = timezone(timedelta(hours=1))
    rows = [_row(1), MappingProxyType(_row(2, expires_at=datetime(2027, 1, 1, tzinfo=paris))),
            _row(3, args="x" * 100_000)]
    stream = io.BytesIO(encode_rows(rows, 7, "key") + encode_rows([_row(4)], 7, None) + STOP)

    first = _read_message(stream)
    assert first is not None
    assert (first["worker_id"], first["task_id_key"]) == (7, "key")
    assert [_decode_row(row) for row in first["rows"]] == [dict(row) for row in rows]
    assert first["rows"][1]["expires_at"].utcoffset() == timedelta(hours=1)
    second = _read_message(stream)
    assert second is not None and [row["id"] for row in second["rows"]] == [4]
    assert second["task_id_key"] is None
    assert _read_message(stream) == {"stop": True}
    assert _read_message(stream) is None  # end of file: the parent is gone


def test_a_message_cut_short_reads_as_the_parent_gone() -> None:
    data = encode_rows([_row(1)], 7, "key")
    for cut in (3, len(data) - 1):
        assert _read_message(io.BytesIO(data[:cut])) is None


def test_a_message_larger_than_the_pipe_arrives_whole() -> None:
    read_fd, write_fd = os.pipe()
    data = encode_rows([_row(1, args="y" * 1_000_000)], None)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the writer
        os.close(read_fd)
        with os.fdopen(write_fd, "wb") as writer:
            writer.write(data)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        message = _read_message(reader)
    os.waitpid(pid, 0)
    assert message is not None and len(message["rows"][0]["args"]) == 1_000_000
