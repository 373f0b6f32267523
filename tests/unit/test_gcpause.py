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
