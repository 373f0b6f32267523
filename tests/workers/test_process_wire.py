"""The process pool's wire format: the rows a parent writes to a child at once are one JSON
line, read back in the child as the same rows, in order; a child's answer reads back as the
outcome it sent."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from akadze_core.execution.process_child import (
    STOP,
    _decode_row,
    _encode_answer,
    decode_answer,
    encode_rows,
)
from akadze_core.model.outcomes import Outcome


def _row(job_id: int, **values: Any) -> dict[str, Any]:
    at = datetime(2026, 12, 6, 22, 48, 45, 772296, tzinfo=timezone.utc)
    return {"id": job_id, "task": "app.add", "queue": "celery",
            "args": '{"args": ["line\\nbreak", "ü€😀"], "kwargs": {}}', "priority": 0,
            "scheduled_at": at, "expires_at": None, "created_at": at,
            "started_at": at + timedelta(seconds=1), "cancel_requested": False,
            "upstreams": [1, 2], "claim_token": 2 ** 60, "releases": False, "meta": None,
            **values}


def test_rows_written_at_once_are_one_line_read_back_the_same_in_order() -> None:
    paris = timezone(timedelta(hours=1))
    rows = [_row(1), MappingProxyType(_row(2, expires_at=datetime(2027, 1, 1, tzinfo=paris))),
            _row(3, args="x" * 100_000)]
    data = encode_rows(rows, 7, "key")
    assert data.endswith(b"\n") and data.count(b"\n") == 1

    message = json.loads(data)
    assert (message["worker_id"], message["task_id_key"]) == (7, "key")
    assert [_decode_row(row) for row in message["rows"]] == [dict(row) for row in rows]
    assert message["rows"][1]["expires_at"].utcoffset() == timedelta(hours=1)
    assert json.loads(STOP) == {"stop": True}


def test_an_answer_reads_back_as_the_outcome_sent() -> None:
    outcome = Outcome(5, 2, "success", '"ü"', 0.0, None, None, 2 ** 60)
    assert decode_answer(_encode_answer(0.25, outcome)) == (0.25, outcome)
    assert decode_answer(_encode_answer(0.5, None)) == (0.5, None)
