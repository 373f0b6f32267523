"""The payloads pause and resume notify (akadze.queue_pause, akadze.queue_resume)."""

from __future__ import annotations

from akadze_core.store.pauses import parse_notice


def test_a_pause_notice_says_the_queue_and_whether_it_is_paused() -> None:
    assert parse_notice("1emails") == ("emails", True)
    assert parse_notice("0emails") == ("emails", False)
    assert parse_notice("01") == ("1", False)


def test_anything_else_is_not_a_pause_notice() -> None:
    assert parse_notice("") is None
    assert parse_notice("1") is None
    assert parse_notice("xemails") is None
