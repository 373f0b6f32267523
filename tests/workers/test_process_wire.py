"""The process pool's wire format: the rows a parent writes to a child at once are one JSON
line, read back in the child as the same rows, in order; a child's answer reads back as the
outcome it sent."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from akadze_core.execution.process_child import (
    ROW_FIELDS,
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


def _sent(row: Any) -> dict[str, Any]:
    """What a child reads of ``row``: its ``ROW_FIELDS`` (the claim's ``releases`` and
    ``notified`` stay in the parent)."""
    return {name: row[name] for name in ROW_FIELDS if name in row}


def _claimed(job_id: int, **values: Any) -> dict[str, Any]:
    """A row as the claim returns it: every column."""
    columns: dict[str, Any] = {
        "state": "running", "attempt": 1, "max_attempts": 3, "run_count": 1,
        "last_error": None, "upstream_results": None, "result_arg": None, "position": None,
        "notified": None}
    return _row(job_id, **{**columns, **values})


def test_rows_written_at_once_are_one_line_read_back_the_same_in_order() -> None:
    paris = timezone(timedelta(hours=1))
    rows = [_row(1), MappingProxyType(_row(2, expires_at=datetime(2027, 1, 1, tzinfo=paris))),
            _row(3, args="x" * 100_000)]
    data = encode_rows(rows, 7, "key")
    assert data.endswith(b"\n") and data.count(b"\n") == 1

    message = json.loads(data)
    assert (message["worker_id"], message["task_id_key"]) == (7, "key")
    assert [_decode_row(row) for row in message["rows"]] == [_sent(row) for row in rows]
    assert message["rows"][1]["expires_at"].utcoffset() == timedelta(hours=1)
    assert json.loads(STOP) == {"stop": True}


def test_an_answer_reads_back_as_the_outcome_sent() -> None:
    outcome = Outcome(5, 2, "success", '"ü"', 0.0, None, None, 2 ** 60)
    assert decode_answer(_encode_answer(250_000_000, outcome)) == (0.25, outcome)
    assert decode_answer(_encode_answer(500_000_000, None)) == (0.5, None)
    assert decode_answer(_encode_answer(1, None)) == (1e-9, None)
    # Every kind of field an outcome holds: text (any character), a delay, an error entry.
    retry = Outcome(6, 1, "retry", None, 2.5, '{"message": "ü\\n"}', 7, None)
    assert decode_answer(_encode_answer(3, retry)) == (3e-9, retry)


def test_claimed_rows_go_as_their_values_and_read_back_as_the_fields_a_child_reads() -> None:
    at = datetime(2026, 12, 6, 23, 0, tzinfo=timezone.utc)
    rows = [_claimed(1), _claimed(2, scheduled_at=at, created_at=at, last_error='{"a": 1}',
                                  upstream_results="[1]", result_arg="x", position=4)]
    message = json.loads(encode_rows(rows, None))
    assert [len(row) for row in message["rows"]] == [len(ROW_FIELDS)] * 2  # no keys
    assert b"releases" not in encode_rows(rows, None)
    decoded = [_decode_row(row) for row in message["rows"]]
    assert decoded == [_sent(row) for row in rows]
    assert list(decoded[0]) == list(ROW_FIELDS)


def test_a_timestamp_shared_by_rows_reads_back_in_each_rows_zone() -> None:
    # Equal instants in two zones (equal datetimes) are written each with its own offset.
    utc = datetime(2026, 12, 6, 23, 0, tzinfo=timezone.utc)
    paris = utc.astimezone(timezone(timedelta(hours=1)))
    rows = [_claimed(1, scheduled_at=utc, created_at=utc, started_at=utc),
            _claimed(2, scheduled_at=paris, created_at=utc, started_at=paris,
                     expires_at=paris + timedelta(days=1))]
    message = json.loads(encode_rows(rows, 3))
    decoded = [_decode_row(row) for row in message["rows"]]
    assert decoded == [_sent(row) for row in rows]
    assert [[row[name].utcoffset() for name in ("scheduled_at", "created_at", "started_at")]
            for row in decoded] == [[timedelta(0)] * 3,
                                    [timedelta(hours=1), timedelta(0), timedelta(hours=1)]]
    assert decoded[1]["expires_at"].utcoffset() == timedelta(hours=1)
