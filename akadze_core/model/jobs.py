"""The Job record, as read from the jobs table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .serialization import fast_loads

JOB_STATES = ("waiting", "queued", "running", "succeeded", "failed", "cancelled")
#: waiting: a workflow job whose upstreams have not all succeeded yet (never claimed).
ACTIVE_STATES = ("waiting", "queued", "running")
FINISHED_STATES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Job:
    """One row of ``akadze.jobs``. ``attempt`` counts the attempts spent so far."""

    id: int
    task: str
    queue: str
    args: Any
    state: str
    priority: int
    scheduled_at: datetime
    attempt: int
    max_attempts: int
    run_count: int
    errors: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    expires_at: datetime | None = None
    cancel_requested: bool = False
    unique_key: str | None = None
    worker_id: int | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: Workflows (``akadze_core.enqueue.workflow``): the jobs this one waits on, in order (for an
    #: errback, the failed job), how many of them have not succeeded yet, the jobs waiting
    #: on this one, how it takes their results, and those results once released.
    upstreams: list[int] | None = None
    waiting_for: int | None = None
    dependents: list[int] | None = None
    flow: dict[str, Any] | None = None
    upstream_results: Any = None
    #: The job's index in the fan-out it was added with (``Workflow.add_many``'s
    #: ``first_position``; a Celery group member's ``group_index``), else None.
    position: int | None = None
    #: The fencing token of the claim that holds the job (with ``run_count``); None on a
    #: job not read from a claim.
    claim_token: int | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build from a dict row; JSON columns may arrive as text (the worker reads them raw)."""
        values = {name: row[name] for name in cls.__dataclass_fields__ if name in row}
        # upstream_results is not decoded here: a jsonb string arrives as a str already.
        for name in ("errors", "meta", "flow"):
            if isinstance(values.get(name), str):
                values[name] = json.loads(values[name])
        return cls(**values)

    @classmethod
    def from_claim(cls, row: Mapping[str, Any], args: Any, upstream_results: Any = None,
                   meta: dict[str, Any] | None = None) -> Job:
        """The Job of a claimed row whose ``args`` (and workflow ``upstream_results``) are
        decoded already; ``meta``: the row's meta when already decoded (``claimed_meta``)."""
        # Field by field rather than from_row: this runs once per job on the hot path, and
        # the generic form (a dict copy, a comprehension over every field) cost a tenth of a
        # busy worker's time.
        if meta is None:
            meta = cls.claimed_meta(row)
        return cls(row["id"], row["task"], row["queue"], args, row["state"], row["priority"],
                   row["scheduled_at"], row["attempt"], row["max_attempts"], row["run_count"],
                   meta=meta, expires_at=row.get("expires_at"),
                   cancel_requested=row.get("cancel_requested", False),
                   created_at=row.get("created_at"), started_at=row.get("started_at"),
                   upstreams=row.get("upstreams"), upstream_results=upstream_results,
                   position=row.get("position"), claim_token=row.get("claim_token"))

    @staticmethod
    def claimed_meta(row: Mapping[str, Any]) -> dict[str, Any]:
        """The meta of a claimed row, decoded (``{}`` for none)."""
        meta = row.get("meta")
        if isinstance(meta, str):
            # Most jobs carry no meta: skip decoding the empty object.
            # Read once per run: scanned directly (Postgres gives one value, no whitespace).
            meta = {} if meta == "{}" else fast_loads(meta)
        return meta if meta is not None else {}

    def to_json(self) -> dict[str, Any]:
        """The job's fields by their plain names, times in ISO 8601."""
        return {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in asdict(self).items()
        }
