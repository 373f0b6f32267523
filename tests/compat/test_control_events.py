"""``enable_events`` / ``disable_events`` answer from the event groups a Celery worker with
the same options would have (Celery's ``Events`` bootstep and ``EventDispatcher.groups``):
the differential control probe runs its workers without gossip and heartbeats, where both
sides answer "event dispatcher unavailable"; these are the other cases."""

from __future__ import annotations

from typing import Any

import pytest

from akadze_compat import Celery
from akadze_compat.worker.control import (
    ControlState,
    disable_events,
    enable_events,
    event_groups,
)


def _state(app: Celery, options: dict[str, Any]) -> ControlState:
    state = ControlState.__new__(ControlState)
    state.event_groups = event_groups(app, options)
    return state


def test_a_plain_worker_turns_task_events_on_and_off() -> None:
    state = _state(Celery("events"), {})
    assert [enable_events(state), enable_events(state), disable_events(state),
            disable_events(state)] == [
        {"ok": "task events enabled"}, {"ok": "task events already enabled"},
        {"ok": "task events disabled"}, {"ok": "task events already disabled"}]


@pytest.mark.parametrize("options,setting", [({"task_events": True}, False), ({}, True)])
def test_with_task_events_on_every_group_is_sent(options: dict[str, Any],
                                                 setting: bool) -> None:
    app = Celery("events")
    app.conf.worker_send_task_events = setting
    state = _state(app, options)
    # Celery's dispatcher sends every group then: enabling finds nothing to add, and
    # disabling finds no "task" group to remove.
    assert enable_events(state) == {"ok": "task events already enabled"}
    assert disable_events(state) == {"ok": "task events already disabled"}


def test_without_gossip_heartbeats_or_events_there_is_no_dispatcher() -> None:
    state = _state(Celery("events"), {"without_gossip": True, "without_heartbeat": True})
    assert enable_events(state) == {"error": "event dispatcher unavailable"}
    assert disable_events(state) == {"error": "event dispatcher unavailable"}
    assert event_groups(Celery("events"), {"without_gossip": True}) == {"worker"}
