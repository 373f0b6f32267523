"""akadze_core.store.notices and akadze_core.worker.followups: an enqueuing process skips
its insert notices for a moment after sending one, and the worker claims again after each."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

from akadze_core.store import notices
from akadze_core.store.floors import Floors
from akadze_core.store.notices import FOLLOW_UP, WINDOW, NoticeLimiter
from akadze_core.worker.followups import FollowUps

T0 = dt.datetime(2026, 12, 6, 20, 0, tzinfo=dt.timezone.utc)


def test_a_notice_quiets_its_queue_and_priority_for_the_window_only() -> None:
    limiter = NoticeLimiter(window=0.010)
    assert limiter.quiet_since("q", 0, 100.0) is None  # nothing sent yet: notify
    limiter.sent("q", 0, at=100.0)
    assert limiter.quiet_since("q", 0, 100.004) == 100.0
    assert limiter.quiet_since("q", 1, 100.004) is None  # another priority: its own notice
    assert limiter.quiet_since("other", 0, 100.004) is None  # another queue too
    # 11 ms after the notice was sent: the window has closed.
    assert limiter.quiet_since("q", 0, 100.011) is None


def test_a_notice_counts_from_when_it_was_sent_and_an_older_one_does_not_move_it() -> None:
    limiter = NoticeLimiter(window=0.010)
    limiter.sent("q", 0, at=99.992)  # sent 8 ms ago, committed just now
    assert limiter.quiet_since("q", 0, 100.003) is None
    limiter.sent("q", 0, at=100.003)
    limiter.sent("q", 0, at=99.998)  # a slower thread's earlier notice
    assert limiter.quiet_since("q", 0, 100.004) == 100.003


def test_an_insert_skips_only_when_it_should_commit_before_the_window_closes() -> None:
    limiter = NoticeLimiter(window=0.010)
    limiter.sent("q", 0, at=100.0)
    # Quiet inserts lately took 4 ms: one sent 7 ms into the window would commit after it.
    assert limiter.quiet(100.0, 100.001, 100.005)
    limiter.expected = 0.004
    assert limiter.quiet_since("q", 0, 100.005) == 100.0
    assert limiter.quiet_since("q", 0, 100.007) is None


def test_a_skipped_notice_is_covered_only_if_its_insert_committed_within_the_window() -> None:
    limiter = NoticeLimiter(window=0.010)
    assert limiter.quiet(100.0, 100.002, 100.009)
    assert not limiter.quiet(100.0, 100.002, 100.011)  # the follow-up may have run before it
    assert 0.0 < limiter.expected < 0.009  # both durations were counted


def test_the_follow_up_comes_after_the_window_has_closed() -> None:
    assert notices.FOLLOW_UP > notices.WINDOW


async def test_a_follow_up_lowers_the_floors_again_and_wakes_the_claims() -> None:
    floors = Floors()
    floors.set_listening(True)
    floors.bounds("q")
    floors.claimed("q", [{"priority": 0, "scheduled_at": T0, "id": 5}])
    wake = asyncio.Event()
    followups = FollowUps(floors, wake, delay=0.02)
    key = (0, T0 + dt.timedelta(seconds=1))
    followups.heard("q", key)
    # Claims meanwhile take a later job and lift the floor over the notice's key: a job
    # whose notice was skipped (its key above the heard one) would sit below it unseen.
    floors.bounds("q")
    floors.claimed("q", [{"priority": 0, "scheduled_at": T0 + dt.timedelta(seconds=2),
                          "id": 9}])
    assert floors.bounds("q")[1] == [T0 + dt.timedelta(seconds=2)]
    assert not wake.is_set()
    await asyncio.wait_for(wake.wait(), 1)
    assert floors.bounds("q") == ([0], [key[1]], [0])
    followups.close()


async def test_a_notice_without_a_key_asks_for_no_follow_up() -> None:
    floors = Floors()
    wake = asyncio.Event()
    followups = FollowUps(floors, wake, delay=0.01)
    followups.heard("q", None)
    await asyncio.sleep(0.05)
    assert not wake.is_set()


async def test_follow_ups_come_in_order_each_after_its_own_notice() -> None:
    floors = Floors()
    wake = asyncio.Event()
    # Delays far apart, so that a timer late on a loaded machine still fires in its turn.
    followups = FollowUps(floors, wake, delay=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    followups.heard("q", (0, T0))
    await asyncio.sleep(0.15)
    followups.heard("q", (0, T0))
    await asyncio.wait_for(wake.wait(), 2)
    first = loop.time() - started
    wake.clear()
    await asyncio.wait_for(wake.wait(), 2)
    second = loop.time() - started
    assert first >= 0.2 and second >= 0.35 and second - first >= 0.1
    followups.close()


def test_the_docs_state_the_window_and_the_follow_up_the_code_uses() -> None:
    root = Path(__file__).resolve().parents[2]
    window, follow_up = f"{WINDOW * 1000:g} ms", f"{FOLLOW_UP * 1000:g} ms"
    for page in ("docs/reference/choices.md", "docs/design/hot-path.md"):
        text = " ".join((root / page).read_text("utf-8").split())
        assert window in text and follow_up in text, page
