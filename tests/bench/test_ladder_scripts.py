"""The scaling ladder's measuring scripts measure what the docs say: bench.prune deletes
every finished row past retention with the prune service's statement and leaves the queued
ones, and bench.failover reads the queue's pause as the longest gap that ends after the kill.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from bench.failover import _largest_gap
from bench.prune import _fill, _prune


def test_the_prune_bench_deletes_every_finished_job_and_keeps_the_queued(
        database_url: str, db: psycopg.Connection) -> None:
    _fill(database_url, 2_500)
    rows, seconds, steps = asyncio.run(_prune(database_url, batch=100))
    assert rows == 2_500
    assert seconds > 0
    # Ten batches of 100 a step: 1,000, 1,000, then the last 500.
    assert len(steps) == 3
    assert db.execute("SELECT state, count(*) FROM akadze.jobs GROUP BY state").fetchall() == [
        ("queued", 10_000)]


def test_the_pause_is_the_longest_gap_ending_after_the_kill() -> None:
    # Steady before the kill at 10.0, one commit that raced it, then 11 s of nothing.
    moments = [9.0, 9.5, 9.9, 10.01, 21.0, 21.1, 21.2]
    assert _largest_gap(moments, since=10.0) == (21.0 - 10.01, 21.0)
    # A longer gap before the kill is not the failover's.
    length, end = _largest_gap([0.0, 5.0, 9.9, 10.5], since=10.0)
    assert (length, end) == (pytest.approx(0.6), 10.5)
    assert _largest_gap([], since=3.0) == (0.0, 3.0)
