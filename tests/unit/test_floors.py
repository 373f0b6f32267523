"""akadze_core.store.floors: where claims start reading, and what moves it back."""

from __future__ import annotations

import datetime as dt

from akadze_core.store.floors import MARGIN, Floors, parse_notice

T0 = dt.datetime(2026, 12, 2, 6, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def row(priority: int, seconds: float, job_id: int, queue: str = "q") -> dict[str, object]:
    return {"queue": queue, "priority": priority, "scheduled_at": at(seconds), "id": job_id}


def listening(**settings: float) -> Floors:
    floors = Floors(**settings)
    floors.set_listening(True)
    floors.bounds("q")  # the first claim of a queue reads it whole (the rescan is due)
    return floors


def test_a_notice_says_its_queue_and_its_lowest_key() -> None:
    micros = int((T0 - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)).total_seconds() * 1e6)
    assert parse_notice(f"emails\x1f-5\x1f{micros}") == ("emails", (-5, T0))
    assert parse_notice("emails") == ("emails", None)  # statements that carry no key
    # A queue whose name holds the separator but no key is read as a plain name.
    assert parse_notice("odd\x1fname") == ("odd\x1fname", None)


def test_claims_move_each_priority_floor_up_to_the_last_key_taken() -> None:
    floors = listening()
    floors.claimed("q", [row(0, 1, 1), row(0, 2, 2), row(5, 1, 3)])
    assert floors.bounds("q") == ([0, 5], [at(2), at(1)], [2, 3])
    floors.claimed("q", [row(5, 3, 9)])
    floors.claimed("q", [])  # an empty claim keeps them
    assert floors.bounds("q") == ([0, 5], [at(2), at(3)], [2, 9])


def test_a_heard_key_lowers_the_floors_at_its_priority_and_after_it() -> None:
    floors = listening()
    floors.claimed("q", [row(-1, 10, 1), row(0, 10, 2), row(5, 10, 3)])
    floors.heard("q", (0, at(4)))
    assert floors.bounds("q") == ([-1, 0, 5], [at(10), at(4), at(4)], [1, 0, 0])
    floors.heard("q", (0, at(8)))  # above the floors now: nothing moves
    assert floors.bounds("q")[1] == [at(10), at(4), at(4)]
    floors.heard("other", (0, at(0)))  # another queue's
    assert floors.bounds("q")[1] == [at(10), at(4), at(4)]


def test_a_notice_without_a_key_moves_every_floor_back_by_the_margin() -> None:
    floors = listening()
    floors.claimed("q", [row(0, 10, 1), row(3, 20, 2)])
    floors.heard("q", None)
    back = dt.timedelta(seconds=MARGIN)
    assert floors.bounds("q") == ([0, 3], [at(10) - back, at(20) - back], [0, 0])


def test_what_is_heard_while_a_claim_runs_is_not_lifted_over_by_its_rows() -> None:
    # The claim's snapshot may predate the job heard of meanwhile: its rows, though later,
    # must not lift the floor above that job.
    floors = listening()
    floors.claimed("q", [row(0, 10, 1)])
    floors.bounds("q")  # a claim starts
    floors.heard("q", (0, at(5)))
    floors.claimed("q", [row(0, 30, 7)])  # it took later jobs only
    assert floors.bounds("q") == ([0], [at(5)], [0])


def test_own_retries_lower_the_floors_of_their_queue() -> None:
    floors = listening()
    floors.claimed("q", [row(0, 10, 1)])
    floors.requeued([row(0, 9, 1)])
    assert floors.bounds("q") == ([0], [at(9)], [0])


def test_claims_read_the_whole_queue_while_listen_is_down_and_at_each_rescan() -> None:
    floors = listening(rescan_interval=3600)
    floors.claimed("q", [row(0, 10, 1)])
    assert floors.bounds("q") == ([0], [at(10)], [1])
    floors.set_listening(False)  # notifications may be missed: no floors
    assert floors.bounds("q") == ([], [], [])
    floors.claimed("q", [row(0, 10, 1)])
    assert floors.bounds("q") == ([], [], [])
    floors.set_listening(True)  # what was missed is unknown: start again from the head
    assert floors.bounds("q") == ([], [], [])
    floors.claimed("q", [row(0, 11, 2)])
    assert floors.bounds("q") == ([0], [at(11)], [2])
    due = Floors(rescan_interval=0)
    due.set_listening(True)
    due.claimed("q", [row(0, 10, 1)])
    assert due.bounds("q") == ([], [], [])  # every claim is a rescan
