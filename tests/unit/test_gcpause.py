"""collector_paused: the cyclic collector is off inside, back on after, and left as it was
found when it was off already (by the caller, or by an outer pause)."""

from __future__ import annotations

import gc

import pytest

from akadze_core.enqueue.gcpause import collector_paused


def test_paused_inside_and_enabled_again_after_an_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a bad member")
    assert gc.isenabled()


def test_a_nested_pause_leaves_the_outer_one_paused() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_resume_ends_the_pause_once_with_the_young_collection_made() -> None:
    with collector_paused() as resume:
        kept = [[] for _ in range(5000)]
        assert not gc.isenabled() and gc.get_count()[0] >= 5000
        resume()
        assert gc.isenabled() and gc.get_count()[0] < 100
        gc.disable()  # the caller's own choice from then on: the block's end keeps it
        resume()
        assert not gc.isenabled()
    try:
        assert not gc.isenabled() and len(kept) == 5000
    finally:
        gc.enable()


def test_resume_of_a_pause_that_found_the_collector_off_does_nothing() -> None:
    with collector_paused(), collector_paused() as resume:
        resume()
        assert not gc.isenabled()
    assert gc.isenabled()
