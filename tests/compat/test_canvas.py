"""Celery's canvas on a real Postgres: chains, groups, chords, callbacks and errbacks sent as
one workflow each and run by a real akadze_core worker (in-process).

What Celery 5.7 does is the reference (its source, and its interpreter for the shapes of
signatures and results); each test says the Celery behaviour it checks.
"""

from __future__ import annotations

import dataclasses
import json
import types
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from akadze_compat import Celery, Task, chain, chord, group, signature, states
from akadze_compat.canvas import Signature, chunks, xmap, xstarmap
from akadze_compat.exceptions import ChordError, TaskRevokedError
from akadze_compat.result import AsyncResult, GroupResult, ResultSet, allow_join_result
from akadze_core.model.task_ids import TaskIds
from tests.compat.conftest import work


class Boom(Exception):
    """A task's own exception: errbacks and chord errors must name this type."""


def ready(*results: Any) -> Callable[[], bool]:
    return lambda: all(result.ready() for result in results)


def jobs(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute("SELECT task, state, meta->>'task_id' FROM akadze.jobs ORDER BY id"
                      ).fetchall()


def tasks(app: Celery) -> dict[str, Any]:
    """add, mul, tsum, fail and a recorder of errback calls, on ``app``."""
    seen: list[Any] = []

    @app.task(name="t.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="t.tsum")
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(name="t.fail")
    def fail(*args: Any) -> None:
        raise Boom("boom")

    @app.task(name="t.on_error")
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        seen.append(("new", request.id, type(exc), str(exc), request.args))

    @app.task(name="t.on_error_old")
    def on_error_old(task_id: str) -> None:
        seen.append(("old", task_id))

    @app.task(name="t.record")
    def record(*args: Any) -> None:
        seen.append(("record", *args))

    return {"add": add, "mul": mul, "tsum": tsum, "fail": fail, "on_error": on_error,
            "on_error_old": on_error_old, "record": record, "seen": seen}


# --- chains ---------------------------------------------------------------------------------


async def test_a_chain_is_one_insert_and_passes_each_result_on(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    result = (t["add"].s(2, 2) | t["add"].s(4) | t["mul"].s(10))()
    # Every step is inserted at once, with the id Celery would have frozen; the steps
    # after the first wait for the one before.
    rows = jobs(db)
    assert [(task, state) for task, state, _ in rows] == [
        ("t.add", "queued"), ("t.add", "waiting"), ("t.mul", "waiting")]
    assert [task_id for _, _, task_id in rows] == [
        result.parent.parent.id, result.parent.id, result.id]
    assert result.state == states.PENDING
    await work(celery, ready(result))
    assert result.get(timeout=5) == 80  # ((2 + 2) + 4) * 10
    assert (result.parent.get(timeout=5), result.parent.parent.get(timeout=5)) == (8, 4)
    assert result.parent.parent.children == [result.parent]


async def test_an_immutable_step_ignores_the_previous_result(celery: Celery) -> None:
    t = tasks(celery)
    result = chain(t["add"].s(1, 1), t["add"].si(10, 10), t["add"].s(1)).apply_async()
    await work(celery, ready(result))
    assert result.get(timeout=5) == 21


async def test_partial_args_go_to_the_first_step(celery: Celery) -> None:
    t = tasks(celery)
    result = chain(t["add"].s(1), t["mul"].s(3))(4)
    await work(celery, ready(result))
    assert result.get(timeout=5) == 15


async def test_a_failed_step_stops_the_chain_and_calls_its_errbacks(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    canvas = t["add"].s(1, 1) | t["fail"].s() | t["add"].s(100)
    canvas.link_error(t["on_error"].s())
    canvas.link_error(t["on_error_old"].s())
    result = canvas.apply_async()
    failed = result.parent
    await work(celery, lambda: len(t["seen"]) == 2)
    assert failed.state == states.FAILURE and isinstance(failed.result, Boom)
    # Celery never sends the step after a failure, but stores the failure in it
    # (_fail_chain): FAILURE with the failed step's exception and traceback.
    assert result.state == states.FAILURE and result.ready() and result.failed()
    assert isinstance(result.result, Boom) and str(result.result) == "boom"
    assert result.traceback == failed.traceback and "Boom" in (result.traceback or "")
    with pytest.raises(Boom, match="boom"):
        result.get(timeout=5)
    # Without parents (rebuilt from its id) its own row says the same.
    with pytest.raises(Boom, match="boom"):
        celery.AsyncResult(result.id).get(timeout=5)
    assert sorted(t["seen"], key=str) == sorted([
        ("new", failed.id, Boom, "boom", [2]), ("old", failed.id)], key=str)


# --- groups ---------------------------------------------------------------------------------


async def test_a_group_returns_a_group_result_in_order(celery: Celery) -> None:
    t = tasks(celery)
    result = group(t["add"].s(i, i) for i in range(5))()
    assert isinstance(result, GroupResult) and len(result) == 5
    assert [member.id for member in result] == [r.id for r in result.results]
    assert not result.ready() and result.waiting() and result.completed_count() == 0
    await work(celery, result.ready)
    assert result.get(timeout=5) == [0, 2, 4, 6, 8]
    assert result.join(timeout=5) == [0, 2, 4, 6, 8]
    assert (result.successful(), result.failed(), result.completed_count()) == (True, False, 5)
    assert result.children == result.results


async def test_a_groups_state_is_one_read_of_its_unfinished_members(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each of these asks every member: one query for the unfinished ones, not one each
    # (a chord body's get() asks its header's maybe_throw(): it read 10,000 rows one by
    # one while the workers drained them). Reads are counted on the real queries.
    t = tasks(celery)
    result = group(t["add"].s(i, i) for i in range(40))()
    nested = ResultSet([result, t["add"].s(1, 2).apply_async()], app=celery)
    core = type(celery.core)
    calls = {"get_job": 0, "get_jobs": 0}

    def counting(name: str) -> Callable[..., Any]:
        read = getattr(core, name)

        def counted(self: Any, *args: Any) -> Any:
            calls[name] += 1
            return read(self, *args)
        return counted

    for name in calls:
        monkeypatch.setattr(core, name, counting(name))

    def reads(ask: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
        calls.update(get_job=0, get_jobs=0)
        answer = ask()
        return answer, dict(calls)

    assert reads(result.completed_count) == (0, {"get_job": 0, "get_jobs": 1})
    assert reads(result.failed) == (False, {"get_job": 0, "get_jobs": 1})
    assert reads(result.maybe_throw) == (None, {"get_job": 0, "get_jobs": 1})
    assert reads(nested.completed_count) == (0, {"get_job": 0, "get_jobs": 2})
    body = chord(group(t["add"].s(i, i) for i in range(30)), t["tsum"].s())()
    assert reads(body.parent.maybe_throw) == (None, {"get_job": 0, "get_jobs": 1})
    # Nothing kept from those reads: each state is read anew, once the members finished.
    assert result.results[0].state == states.PENDING
    await work(celery, lambda: result.ready() and nested.ready() and body.ready())
    assert result.results[0].state == states.SUCCESS
    assert reads(result.completed_count) == (40, {"get_job": 0, "get_jobs": 0})  # cached
    assert body.get(timeout=5) == sum(range(0, 60, 2))


async def test_a_group_is_built_with_the_collector_paused(celery: Celery) -> None:
    # A publish receiver runs inside the build (prepare): it sees the collector paused, and
    # it is on again once the group is sent (akadze_core.enqueue.gcpause: half a big group's client
    # time went to collections).
    import gc

    from akadze_compat import signals

    add = tasks(celery)["add"]
    seen: list[bool] = []

    def receiver(**_: Any) -> None:
        seen.append(gc.isenabled())

    signals.before_task_publish.connect(receiver)
    try:
        result = group(add.s(i, i) for i in range(3)).apply_async()
    finally:
        signals.before_task_publish.disconnect(receiver)
    assert len(result) == 3 and seen == [False, False, False] and gc.isenabled()


async def test_a_group_with_a_failure_raises_it_in_order(celery: Celery) -> None:
    t = tasks(celery)
    result = group(t["add"].s(1, 1), t["fail"].s(), t["add"].s(2, 2)).apply_async()
    await work(celery, result.ready)
    assert result.failed() and not result.successful() and result.completed_count() == 2
    with pytest.raises(Boom):
        result.get(timeout=5)
    values = result.get(timeout=5, propagate=False)
    assert values[0] == 2 and isinstance(values[1], Boom) and values[2] == 4


async def test_the_chain_class_celery_canvas_exports_builds_a_chain(celery: Celery) -> None:
    # celery.canvas._chain, built directly (as Celery's own t/integration does), led by a
    # group: the group's results go to the next step as a chord's.
    from akadze_compat.canvas import _chain

    t = tasks(celery)
    result = _chain(group(t["add"].si(1, 1), t["add"].si(2, 2)), t["tsum"].s(),
                    t["add"].s(10)).delay()
    await work(celery, ready(result))
    assert result.get(timeout=5) == 16


async def test_a_header_member_giving_a_list_gives_the_body_that_list(
        celery: Celery) -> None:
    # "The chain prevents unrolling" (Celery's t/integration
    # test_nested_chord_group_chain_group_tail): a chain ending in a group is one header
    # member, whose value is its group's list; its failure names the failed task.
    t = tasks(celery)
    nested = chord(group(chain(t["add"].s(40, 2), group(t["add"].s(0), t["add"].s(1))),
                         t["add"].si(1, 1)), t["record"].s())
    result = nested.apply_async()
    failing = chord([chain(t["add"].s(1, 1), group(t["add"].s(0), t["fail"].s()))],
                    t["tsum"].s()).apply_async()
    await work(celery, ready(result, failing))
    assert t["seen"] == [("record", [[42, 43], 2])]
    member = failing.parent.results[0].results[1]
    assert failing.state == states.FAILURE and isinstance(failing.result, ChordError)
    assert str(failing.result) == f"Dependency {member.id} raised Boom('boom')"


async def test_a_group_body_fails_with_the_header_members_own_exception(
        celery: Celery) -> None:
    # Celery 5.7 fails each task of a group body with the failed header member's own
    # exception and calls its errbacks with it (_handle_group_chord_error; its
    # t/integration test_chord_error_propagation_with_different_body_types, and what real
    # Celery on Redis gives); a single body fails with ChordError.
    t = tasks(celery)
    second = t["add"].si(5, 7)
    second.link_error(t["on_error"].s())
    grouped = chain(group([t["add"].si(15, 7), t["fail"].si()]),
                    group([t["add"].si(9, 7), second])).apply_async()
    single = chain(group([t["add"].si(15, 7), t["fail"].si()]), t["tsum"].s()).apply_async()
    await work(celery, lambda: ready(grouped, single)() and len(t["seen"]) == 1)
    with pytest.raises(Boom):
        grouped.get(timeout=5)
    assert [type(value) for value in grouped.get(timeout=5, propagate=False)] == [Boom, Boom]
    assert isinstance(single.result, ChordError)
    [(kind, failed_id, exc_type, message, _)] = t["seen"]
    assert (kind, failed_id, exc_type, message) == ("new", grouped.results[1].id, Boom, "boom")


async def test_a_chords_errback_runs_once_when_a_chord_in_its_header_fails(
        celery: Celery, db: psycopg.Connection) -> None:
    # Celery's t/integration test_nested_chord_header_link_error: the outer chord's
    # errback runs once, and neither body runs. (Errbacks are jobs inserted with the
    # failure: the worker runs until none is left to run.)
    t = tasks(celery)
    inner = chord([t["add"].si(1, 1), t["fail"].si()], t["record"].si("inner body"))
    outer = chord(group([t["add"].si(2, 2), inner]), t["record"].si("outer body"))
    outer.link_error(t["record"].si("errback"))
    result = outer.delay()

    def drained() -> bool:
        return ready(result)() and db.execute(
            "SELECT count(*) FROM akadze.jobs WHERE state IN ('queued', 'running')"
        ).fetchone() == (0,)

    await work(celery, drained)
    assert t["seen"] == [("record", "errback")]
    assert result.state == states.FAILURE


async def test_a_chords_link_options_add_to_its_bodys_own(celery: Celery) -> None:
    # Celery 5.7 (its t/integration test_link_option_runs_after_the_body,
    # test_link_option_on_group_body_runs_once, test_link_error_option_runs_on_body_failure):
    # apply_async(link=, link_error=) of a chord adds to the body's callbacks, once for a
    # group body as group.link() does; the caller's body is left as it was.
    t = tasks(celery)
    body = t["tsum"].s()
    body.link(t["record"].si("own"))
    plain = chord([t["add"].si(1, 1), t["add"].si(2, 2)], body).apply_async(
        link=t["record"].s())
    first = t["tsum"].s()
    first.link(t["record"].si("own first"))
    grouped = chord([t["add"].si(1, 1), t["add"].si(2, 2)], group(first, t["tsum"].s())
                    ).apply_async(link=t["record"].si("group body"))
    failing = t["fail"].s()
    failing.link_error(t["on_error_old"].s())
    failed = chord([t["add"].si(1, 1)], failing).apply_async(link_error=t["on_error"].s())
    await work(celery, lambda: ready(plain, grouped, failed)() and len(t["seen"]) >= 6)
    assert (plain.get(timeout=5), grouped.get(timeout=5)) == (6, [6, 6])
    seen = t["seen"]
    assert sorted((entry for entry in seen if entry[0] == "record"), key=str) == [
        ("record", "group body"), ("record", "own first"), ("record", "own"), ("record", 6)]
    assert sorted(entry[0] for entry in seen if entry[0] != "record") == ["new", "old"]
    assert body.options["link"] == [t["record"].si("own")] and "link_error" not in body.options


async def test_a_chord_header_is_its_own_copies_and_takes_tasks(celery: Celery) -> None:
    # As Celery's _maybe_group: a header list's items are signature()'s of them: copies
    # (what the chord does to them, link_error here, leaves the caller's alone) and a task
    # called with no arguments of its own (Celery's t/integration
    # test_group_in_center_of_chain, with these tasks).
    t = tasks(celery)
    celery.conf.task_allow_error_cb_on_chord_header = True
    header = [t["add"].s(1, 1), t["add"].s(2, 2)]
    linked = chord(header, t["tsum"].s())
    linked.link_error(t["record"].si("err"))
    assert [task is mine for task, mine in zip(linked.tasks, header, strict=True)] == \
        [False, False]
    assert [sig.options for sig in header] == [{}, {}]
    inner = chain(t["tsum"].s(), group(t["add"].s(8), t["add"].s(16)),
                  t["tsum"].s() | t["add"].s(32))
    result = chord([t["add"].s(0, 1)], chord([t["tsum"], t["tsum"]], inner)).apply_async()
    await work(celery, ready(result))
    assert result.get(timeout=5) == 60


async def test_a_task_returning_a_result_stores_its_tuple_form(celery: Celery) -> None:
    # As Celery's backends store a returned result with any serializer but pickle:
    # as_tuple(), which result_from_tuple rebuilds (its t/integration
    # test_groupresult_serialization, whose task returns a chain's result).
    from akadze_compat.result import result_from_tuple

    t = tasks(celery)

    @celery.task(name="t.builds")
    def builds() -> Any:
        return (t["add"].s(1, 1) | t["add"].s(2) | group(t["add"].s(3), t["add"].s(4))
                | t["tsum"].s())()

    result = builds.delay()
    await work(celery, ready(result))
    value = result.get(timeout=5)
    assert len(value) == 2 and isinstance(value[0][1], list)  # (id, its parent's tuple)
    rebuilt = result_from_tuple(value, app=celery)
    await work(celery, ready(rebuilt))
    assert rebuilt.get(timeout=5) == 15 and rebuilt.parent.get(timeout=5) == [7, 8]


async def test_empty_chains_in_a_group_or_chord_header_are_dropped(celery: Celery) -> None:
    # As Celery 5.7 (celery#9772, in its t/integration): an empty chain sends nothing and
    # has no result; a header of nothing else runs the body at once with [].
    t = tasks(celery)

    def empty() -> Any:  # an empty chain's app is the current one, as in Celery: not this
        return chain(app=celery)

    grouped = group(empty(), t["add"].s(1, 2), empty(), t["add"].s(3, 4)).apply_async()
    alone = chord([empty()], body=t["tsum"].s())()
    mixed = chord([empty(), t["add"].s(1, 1), empty(), t["add"].s(2, 2)], body=t["tsum"].s())()
    assert len(grouped.results) == 2 and len(mixed.parent.results) == 2
    await work(celery, ready(grouped, alone, mixed))
    assert grouped.get(timeout=5) == [3, 7]
    assert (alone.get(timeout=5), mixed.get(timeout=5)) == (0, 6)


async def test_a_group_of_chains(celery: Celery) -> None:
    t = tasks(celery)
    result = group(t["add"].s(i, i) | t["mul"].s(10) for i in range(3))()
    await work(celery, result.ready)
    assert result.get(timeout=5) == [0, 20, 40]


async def test_a_chain_fans_out_to_a_group(celery: Celery) -> None:
    t = tasks(celery)
    result = (t["add"].s(1, 1) | group(t["mul"].s(10), t["mul"].s(100)))()
    assert isinstance(result, GroupResult)
    await work(celery, result.ready)
    assert result.get(timeout=5) == [20, 200]


async def test_revoking_a_group_revokes_its_members(celery: Celery) -> None:
    t = tasks(celery)
    result = group(t["add"].s(1, 1), t["add"].s(2, 2)).apply_async(countdown=60)
    result.revoke()
    assert [member.state for member in result] == [states.REVOKED, states.REVOKED]
    with pytest.raises(TaskRevokedError):
        result.get(timeout=5)


async def test_revoking_a_chains_head_stops_the_rest(celery: Celery,
                                                     db: psycopg.Connection) -> None:
    t = tasks(celery)
    result = (t["add"].s(1, 1) | t["add"].s(1) | t["add"].s(1)).apply_async(countdown=60)
    head = result.parent.parent
    head.revoke()
    assert head.state == states.REVOKED
    assert [state for _, state, _ in jobs(db)] == ["cancelled", "cancelled", "cancelled"]
    assert result.state == states.PENDING  # never sent, as in Celery
    with pytest.raises(TaskRevokedError):
        result.get(timeout=5)


# --- chords ---------------------------------------------------------------------------------


async def test_a_chord_calls_its_body_with_the_list(celery: Celery) -> None:
    t = tasks(celery)
    result = chord([t["add"].s(i, i) for i in range(4)], t["tsum"].s())()
    assert isinstance(result.parent, GroupResult) and len(result.parent) == 4
    await work(celery, ready(result))
    assert result.get(timeout=5) == 12
    assert result.parent.get(timeout=5) == [0, 2, 4, 6]


async def test_chord_header_then_body_and_group_or_task(celery: Celery) -> None:
    t = tasks(celery)
    first = chord(t["add"].s(i, 1) for i in range(3))(t["tsum"].s())
    second = (group(t["add"].s(i, 2) for i in range(3)) | t["tsum"].s()).delay()
    third = (t["add"].s(1, 1) | group(t["add"].s(1), t["add"].s(2)) | t["tsum"].s())()
    await work(celery, ready(first, second, third))
    assert (first.get(timeout=5), second.get(timeout=5), third.get(timeout=5)) == (6, 9, 7)


async def test_a_chord_of_chords(celery: Celery) -> None:
    t = tasks(celery)
    inner = [chord([t["add"].s(i, i), t["add"].s(i, 1)], t["tsum"].s()) for i in range(3)]
    result = chord(inner, t["tsum"].s())()
    await work(celery, ready(result))
    # inner i: (i + i) + (i + 1); the outer body sums the inner bodies: 1 + 4 + 7.
    assert result.get(timeout=5) == 12


async def test_a_failed_member_fails_the_body_with_a_chord_error(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    body = t["tsum"].s()
    body.link_error(t["on_error"].s())
    result = chord([t["add"].s(1, 1), t["fail"].s()], body)()
    member = result.parent.results[1]
    await work(celery, lambda: bool(t["seen"]))
    assert result.state == states.FAILURE and result.ready()
    # Celery's wording: 'Dependency <member id> raised <member exception repr>'.
    expected = f"Dependency {member.id} raised Boom('boom')"
    assert isinstance(result.result, ChordError) and str(result.result) == expected
    # get() checks the parents first, as Celery's: the header's failed member raises its
    # own exception; a result rebuilt from the body's id alone has no parents.
    with pytest.raises(Boom, match="boom"):
        result.get(timeout=5)
    with pytest.raises(ChordError, match="Dependency"):
        result.get(timeout=5, follow_parents=False)
    with pytest.raises(ChordError, match="Dependency"):
        celery.AsyncResult(result.id).get(timeout=5)
    # The body's errback is called with the body's request and the ChordError.
    assert t["seen"] == [("new", result.id, ChordError, expected, [])]
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE task = 't.tsum' "
                      "AND started_at IS NOT NULL").fetchone() == (0,)


# --- link, chunks, map ---------------------------------------------------------------------


async def test_link_runs_the_callback_with_the_result(celery: Celery) -> None:
    t = tasks(celery)
    callback = t["record"].s("after")
    result = t["add"].apply_async((2, 3), link=callback, link_error=t["on_error_old"].s())
    await work(celery, lambda: bool(t["seen"]))
    assert result.get(timeout=5) == 5
    assert t["seen"] == [("record", 5, "after")]
    assert [child.name for child in result.children or []] == ["t.record"]


async def test_link_error_on_a_single_task_and_on_error(celery: Celery) -> None:
    t = tasks(celery)
    result = t["fail"].s(7).on_error(t["on_error"].s()).delay()
    await work(celery, lambda: bool(t["seen"]))
    assert t["seen"] == [("new", result.id, Boom, "boom", [7])]


async def test_chunks_map_and_starmap(celery: Celery) -> None:
    t = tasks(celery)
    chunked = t["add"].chunks([(i, i) for i in range(5)], 2)()
    mapped = t["tsum"].map([[1, 2], [3, 4]]).apply_async()
    starred = t["add"].starmap([(1, 2), (3, 4)]).delay()
    await work(celery, ready(chunked, mapped, starred))
    assert chunked.get(timeout=5) == [[0, 2], [4, 6], [8]]
    assert (mapped.get(timeout=5), starred.get(timeout=5)) == ([3, 7], [3, 7])


# --- results ---------------------------------------------------------------------------------


async def test_a_group_result_is_saved_and_restored(celery: Celery) -> None:
    t = tasks(celery)
    result = group(t["add"].s(1, 1), t["add"].s(2, 2))()
    result.save()
    await work(celery, result.ready)
    restored = celery.GroupResult.restore(result.id)
    assert isinstance(restored, GroupResult) and restored == result
    assert restored.get(timeout=5) == [2, 4]
    restored.delete()
    assert GroupResult.restore(result.id, app=celery) is None
    assert ResultSet(list(result.results)).get(timeout=5) == [2, 4]


async def test_get_inside_a_task_is_refused_unless_allowed(celery: Celery) -> None:
    t = tasks(celery)
    outcome: dict[str, Any] = {}
    other = t["add"].delay(1, 1)

    @celery.task(name="t.waits")
    def waits() -> None:
        try:
            other.get(timeout=1)
        except RuntimeError as exc:
            outcome["refused"] = str(exc)
        with allow_join_result():
            outcome["allowed"] = other.get(timeout=10)

    result = waits.delay()
    await work(celery, ready(result))
    assert outcome["refused"].startswith("Never call result.get() within a task!")
    assert outcome["allowed"] == 2


async def test_a_canvas_in_a_rolled_back_transaction_inserts_nothing(
        celery: Celery, db: psycopg.Connection, database_url: str) -> None:
    t = tasks(celery)
    with psycopg.connect(database_url) as connection:
        (t["add"].s(1, 1) | t["add"].s(2)).apply_async(connection=connection)
        connection.rollback()
    assert jobs(db) == []


# --- signatures as data ----------------------------------------------------------------------


async def test_a_canvas_round_trips_through_json_and_runs(celery: Celery) -> None:
    t = tasks(celery)
    canvas = t["add"].s(1, 1) | group(t["add"].s(1), t["add"].s(2)) | t["tsum"].s()
    rebuilt = signature(json.loads(json.dumps(canvas)), app=celery)
    assert type(rebuilt) is type(canvas)
    assert json.loads(json.dumps(rebuilt)) == json.loads(json.dumps(canvas))
    assert [type(step).__name__ for step in rebuilt.tasks] == ["Signature", "_chord"]
    result = rebuilt.apply_async()
    await work(celery, ready(result))
    assert result.get(timeout=5) == 7


def test_subtask_types_rebuild_their_classes(celery: Celery) -> None:
    t = tasks(celery)
    for canvas in (t["add"].s(1) | t["add"].s(2), group(t["add"].s(1, 1)),
                   chord([t["add"].s(1, 1)], t["tsum"].s())):
        rebuilt = Signature.from_dict(json.loads(json.dumps(canvas)), app=celery)
        assert type(rebuilt) is type(canvas)
        assert json.loads(json.dumps(rebuilt)) == json.loads(json.dumps(canvas))
    for made in (chunks(t["add"].s(), [(1, 1)], 1), xmap(t["add"].s(), [1]),
                 xstarmap(t["add"].s(), [(1, 1)])):
        data = {**json.loads(json.dumps(made)), "subtask_type": type(made).__name__}
        assert type(Signature.from_dict(data, app=celery)) is type(made)


def test_freeze_gives_the_ids_sending_uses(celery: Celery) -> None:
    t = tasks(celery)
    sig = t["add"].s(1, 1)
    frozen = sig.freeze()
    assert isinstance(frozen, AsyncResult) and sig.id == frozen.id == sig.freeze().id
    canvas = t["add"].s(1, 1) | t["add"].s(2)
    last = canvas.freeze()
    assert last.id == canvas.tasks[-1].id and last.parent.id == canvas.tasks[0].id


def test_a_task_used_as_a_base_class_keeps_s_and_si(celery: Celery) -> None:
    class Base(Task):
        pass

    @celery.task(base=Base, name="t.based")
    def based(x: int) -> int:
        return x

    assert based.s(1).args == (1,) and based.si(1).immutable


# --- ids, options, retries ------------------------------------------------------------------


async def test_task_id_names_the_tail_and_options_go_to_the_first_step(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    result = (t["add"].s(1, 1) | t["add"].s(2)).apply_async(task_id="the-end", queue="first")
    assert result.id == "the-end"
    # Celery applies a chain's options to its first task; the next ones are sent with their
    # own (here the default queue).
    assert db.execute("SELECT queue FROM akadze.jobs ORDER BY id").fetchall() == [
        ("first",), ("celery",)]
    grouped = group(t["add"].s(1, 1), t["add"].s(2, 2)).apply_async(task_id="g-1")
    assert grouped.id == "g-1"
    body = chord([t["add"].s(1, 1)], t["tsum"].s()).apply_async(task_id="body-1")
    assert body.id == "body-1"
    await work(celery, ready(body, grouped), queues=("first", "celery"))
    assert celery.AsyncResult("the-end").get(timeout=5) == 4
    # A member's group index: in its meta, or (sent in bulk) its job's position.
    rows = db.execute("SELECT args, coalesce(meta->'celery'->'group_index', "
                      "to_jsonb(position)) FROM akadze.jobs "
                      "WHERE meta->'celery'->>'group_id' = 'g-1' ORDER BY id").fetchall()
    assert rows == [({"args": [1, 1], "kwargs": {}}, 0), ({"args": [2, 2], "kwargs": {}}, 1)]


async def test_a_retried_step_passes_its_final_result_once(celery: Celery) -> None:
    t = tasks(celery)
    attempts: list[list[Any]] = []

    @celery.task(bind=True, name="t.flaky", default_retry_delay=0)
    def flaky(self: Task, value: int) -> int:
        attempts.append(list(self.request.args))
        if len(attempts) < 2:
            raise self.retry()
        return value * 10

    result = (t["add"].s(1, 2) | flaky.s() | t["add"].s(1))()
    await work(celery, ready(result))
    assert result.get(timeout=5) == 31
    assert attempts == [[3], [3]]  # the previous result first, at every attempt


async def test_a_chord_body_chain_and_its_errback(celery: Celery) -> None:
    t = tasks(celery)
    ok = chord([t["add"].s(1, 1), t["add"].s(2, 2)], t["tsum"].s() | t["mul"].s(10))()
    assert ok.parent.parent is not None  # body chain -> tsum -> header
    await work(celery, ready(ok))
    assert ok.get(timeout=5) == 60
    assert isinstance(ok.parent.parent, GroupResult)


async def test_members_see_their_group_and_a_revoked_member_fails_the_body(
        celery: Celery) -> None:
    t = tasks(celery)
    seen: list[Any] = []

    @celery.task(bind=True, name="t.where")
    def where(self: Task) -> int:
        seen.append((self.request.group, self.request.group_index))
        return 1

    grouped = group(where.s(), where.s())()
    late = t["add"].s(1, 1).set(countdown=60)
    body = chord([t["add"].s(1, 1), late], t["tsum"].s())()
    body.parent.results[1].revoke()
    await work(celery, ready(grouped, body))
    assert sorted(seen) == [(grouped.id, 0), (grouped.id, 1)]
    assert body.state == states.FAILURE
    assert str(body.result) == (f"Dependency {body.parent.results[1].id} raised "
                                "TaskRevokedError('revoked')")


async def test_plain_members_are_known_by_ids_derived_from_their_jobs(
        celery: Celery, db: psycopg.Connection, database_url: str) -> None:
    """A group's plain members store no task id (no bytes nor index entry each, but the
    last one's): each is known by the uuid4-shaped id derived from its job id, the same
    to its task, to lookups, to a revoke, and to another app on the same database."""
    seen: dict[int, tuple[Any, ...]] = {}

    @celery.task(bind=True, name="t.me")
    def me(self: Task, i: int) -> int:
        seen[i] = (self.request.id, self.request.root_id, self.request.group_index)
        return i

    grouped = group(me.s(i) for i in range(5)).apply_async()
    ids = [result.id for result in grouped.results]
    assert len(set(ids)) == 5
    assert all(uuid.UUID(task_id).version == 4 and str(uuid.UUID(task_id)) == task_id
               for task_id in ids)
    assert db.execute("SELECT meta ? 'task_id' FROM akadze.jobs ORDER BY id").fetchall() \
        == [(False,)] * 4 + [(True,)]
    assert [celery.core.find_job(task_id).id for task_id in ids] == \
        [result.job_id for result in grouped.results]
    grouped.results[2].revoke()
    await work(celery, ready(grouped))
    assert seen == {i: (ids[i], ids[i], i) for i in (0, 1, 3, 4)}
    other = Celery("other", broker=database_url, set_as_current=False)
    try:
        assert AsyncResult(ids[1], app=other).get(timeout=5) == 1
        assert AsyncResult(ids[2], app=other).state == states.REVOKED
        assert other.core.find_job(str(uuid.uuid4())) is None  # not derived: not found
    finally:
        other.close()
    # Another database derives other ids from the same job ids.
    key = db.execute("SELECT key FROM akadze.task_id_key").fetchone()[0]
    assert TaskIds(key).derive(grouped.results[0].job_id) == ids[0]
    assert TaskIds("0" * 32).derive(grouped.results[0].job_id) != ids[0]


def seen_meta(node: Any) -> dict[str, Any]:
    """A node's meta as the worker reads it: a member sent in bulk has its group index as
    its job's position, not in its meta."""
    meta = json.loads(node.request.meta)
    if node.position is not None:
        assert "group_index" not in meta["celery"]
        meta["celery"]["group_index"] = node.position
    return dict(meta)


def fast_group_id(builder: Any) -> str:
    """The group id of the first node of ``builder``'s workflow."""
    return str(json.loads(builder.workflow.nodes[0].request.meta)["celery"]["group_id"])


def _results_by_node(builder: Any) -> list[tuple[Any, Any]]:
    """Each node of ``builder``'s workflow with its result, in node order (the results
    made while an insert would run, made now)."""
    builder._make_results()
    found = {id(node): result for node, result, _ in builder._sent}
    for nodes, results in builder._derived:
        # The last node of a run is in _sent: its results are one fewer than its nodes.
        found.update({id(node): result for node, result in zip(nodes, results, strict=False)})
    return [(node, found[id(node)]) for node in builder.workflow.nodes]


def counted_takes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each member ``MemberAdder.take`` was asked about was taken, in order."""
    from akadze_compat.app.flow import MemberAdder

    taken: list[bool] = []
    call = MemberAdder.take

    def counted(self: MemberAdder, member: Any) -> Any:
        added = call(self, member)
        taken.append(added is not None)
        return added

    monkeypatch.setattr(MemberAdder, "take", counted)
    return taken


@pytest.mark.parametrize("shape", ["group", "chord", "after a step"])
def test_plain_members_added_at_once_equal_rows_built_in_full(
        celery: Celery, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's plain members (``task.s(...)``, no options of their own) skip the copy
    and the meta encoding per member (flow.MemberAdder): each row, its result and how it
    waits must be what the full way (a clone, freeze and row per member) gives."""
    from akadze_compat.app.flow import Builder

    taken = counted_takes(monkeypatch)
    t = tasks(celery)
    celery.conf.task_routes = {"t.add": {"queue": "adds", "priority": 3}}
    members = [t["add"].s(1), t["mul"].s(2), t["add"].si(2, 2), t["add"].s(3)]
    members += [t["add"].s(i) for i in range(150)]  # past the insert's 100-node arrays
    header = group(members).set(task_id="g-1", soft_time_limit=5)
    canvas: Any = header
    if shape == "chord":
        canvas = chord(header, t["tsum"].s())
    elif shape == "after a step":
        canvas = t["add"].s(1, 1).set(task_id="head-1") | header
    built = []
    for reuse in (True, False):
        builder = Builder(celery, reuse=reuse)
        canvas.clone().to_flow(builder, args=(5,), after=[], many=False, failure="cancel")
        built.append(builder)
    fast, full = built
    assert sum(taken) == 154  # every member the fast way; the full build declines all
    assert len(fast.workflow.nodes) == len(full.workflow.nodes) >= 154
    fast_nodes, full_nodes = _results_by_node(fast), _results_by_node(full)
    derived = 0
    for number, (mine, theirs) in enumerate(zip(fast_nodes, full_nodes, strict=True)):
        (node, result), (other, other_result) = mine, theirs
        meta = seen_meta(node)
        expected = json.loads(other.request.meta)
        if "task_id" in meta:
            assert result.id == meta["task_id"]
            assert (result.id == other_result.id) is (result.id == "head-1")  # else: new ids
            expected["task_id"] = meta["task_id"]
        else:  # known by the id derived from its job id: given once inserted
            derived += 1
            with pytest.raises(RuntimeError, match="known once its job is inserted"):
                result.id  # noqa: B018  # the property raises
            assert other_result.id
            del expected["task_id"]
        if shape == "chord" and "group_id" in meta["celery"]:  # the chord draws its own
            assert meta["celery"]["group_id"] == fast_group_id(fast)
            expected["celery"]["group_id"] = meta["celery"]["group_id"]
        if shape == "chord" and number == len(fast_nodes) - 1:  # the body: sent by the
            last = fast_nodes[-2][1].id                          # last member, its root
            assert last and meta["celery"]["parent_id"] == meta["celery"]["root_id"] == last
            expected["celery"]["parent_id"] = expected["celery"]["root_id"] = last
        assert meta == expected, number
        # The spliced text is what dumps() gives for it (jsonb orders the keys anyway).
        assert node.request.meta == celery.core.json_dumps(json.loads(node.request.meta)), \
            number
        assert node.request == dataclasses.replace(other.request, meta=node.request.meta)
        assert result.ignored == other_result.ignored and result.task_name == \
            other_result.task_name
        flows = (fast.workflow, full.workflow)
        assert [w._upstreams[node.index] for w in flows[:1]] == \
            [full.workflow._upstreams[other.index]]
        assert fast.workflow._flow[node.index] == full.workflow._flow[other.index]
        assert fast.workflow._pending[node.index] == full.workflow._pending[other.index]
    # Members waiting on nothing store no task id but the last of each run of one row
    # (the add, mul, add.si and 150 add members: four runs); after a step, all do.
    assert derived == (0 if shape == "after a step" else 150)
    member_meta = seen_meta(fast.workflow.nodes[-1 if shape != "chord" else -2])["celery"]
    assert member_meta["group_index"] == 153
    assert member_meta["group_id"] == ("g-1" if shape != "chord" else fast_group_id(fast))
    assert json.loads(fast.workflow.nodes[2].request.args if shape != "after a step"
                      else fast.workflow.nodes[3].request.args)["args"] == [2, 2]


@pytest.mark.parametrize("members", ["alike", "immutable", "list args", "other containers",
                                     "one of another app"])
@pytest.mark.parametrize("partial", [None, (5,)], ids=["no partial", "partial"])
def test_a_group_of_alike_members_is_told_at_once_and_equals_rows_built_in_full(
        celery: Celery, members: str, partial: Any, database_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``group(task.s(i) for i in ...)``: members all plain, of one task, app and
    immutability are told alike at once (MemberAdder.take_all: ``take`` asked of the first
    only) and their args encoded as they are when no partial args change them; a member
    that differs sends the group member by member. Each row must be the one the full way
    (a clone, freeze and row per member) gives."""
    from akadze_compat.app.flow import Builder

    taken = counted_takes(monkeypatch)
    t = tasks(celery)
    if members == "immutable":
        sigs = [t["add"].si(i, 1) for i in range(230)]
    else:
        sigs = [t["add"].s(i) for i in range(230)]
    if members == "list args":  # what the members' args are stored as: encoded alike
        sigs[7]["args"] = [7]
    elif members == "other containers":  # copied into a list and a dict first
        sigs[9]["kwargs"] = types.MappingProxyType({"y": 2})
        sigs[9]["args"] = range(9, 10)
    other = Celery("other", broker=database_url, set_as_current=False)
    if members == "one of another app":
        sigs[100] = tasks(other)["add"].s(100)
    canvas = group(sigs).set(task_id="g-alike")
    built = []
    try:
        for reuse in (True, False):
            builder = Builder(celery, reuse=reuse)
            canvas.clone().to_flow(builder, args=partial, after=[], many=False,
                                   failure="cancel")
            built.append(builder)
            if reuse:
                fast_taken = list(taken)
    finally:
        other.close()
    fast, full = built
    alike = members != "one of another app"
    assert len(fast_taken) == (1 if alike else 230) and all(fast_taken)
    assert len(fast.workflow.nodes) == len(full.workflow.nodes) == 230
    for number, (node, other_node) in enumerate(zip(fast.workflow.nodes,
                                                    full.workflow.nodes, strict=True)):
        meta, expected = seen_meta(node), json.loads(other_node.request.meta)
        meta.pop("task_id", None)
        expected.pop("task_id")
        assert meta == expected and meta["celery"]["group_index"] == number
        assert node.request == dataclasses.replace(other_node.request,
                                                   meta=node.request.meta), number
    args = json.loads(fast.workflow.nodes[9].request.args)
    if members == "immutable":
        assert args == {"args": [9, 1], "kwargs": {}}
    else:
        assert args == {"args": [*(partial or ()), 9],
                        "kwargs": {"y": 2} if members == "other containers" else {}}


def test_a_big_groups_members_store_the_meta_built_in_full(celery: Celery,
                                                           db: psycopg.Connection) -> None:
    """The members of a group sent in bulk get their group index as their job's position
    (first_position), written by the insert, and share the group's meta: each stored meta
    with that index must be the one built for that member alone, and the last member of
    each run, sent with its own meta, has it in its meta."""
    from akadze_compat.app.flow import Builder

    t = tasks(celery)
    canvas = group([t["add"].s(i, i) for i in range(250)] + [t["mul"].s(2, 3)]
                   + [t["add"].s(i, 1) for i in range(120)])
    frozen = canvas.clone().set(task_id="g-big")
    frozen.freeze()
    builder = Builder(celery, reuse=False)
    frozen.to_flow(builder, after=[], many=False, failure="cancel")
    built = [json.loads(node.request.meta) for node in builder.workflow.nodes]
    canvas.apply_async(task_id="g-big")
    rows = db.execute("SELECT meta, position FROM akadze.jobs ORDER BY id").fetchall()
    stored = [meta for meta, _ in rows]
    assert len(stored) == len(built) == 371
    for index, ((mine, position), full) in enumerate(zip(rows, built, strict=True)):
        # Only the last member of each run of one task has a task id of its own (a uuid
        # drawn at send: not the frozen one), and its group index in its meta.
        if "task_id" in mine:
            full["task_id"] = mine["task_id"]
            assert position is None
        else:
            del full["task_id"]
            assert "group_index" not in mine["celery"]
            mine["celery"]["group_index"] = position
        assert mine == full, index
        assert mine["celery"]["group_index"] == index
    assert [i for i, meta in enumerate(stored) if "task_id" in meta] == [249, 250, 370]


def test_a_big_group_is_sent_in_parts_and_a_bad_member_far_in_inserts_nothing(
        celery: Celery, db: psycopg.Connection) -> None:
    """A big group's plain members are encoded as its insert goes, in parts (the core's
    ``add_many(deferred=True)``): its results learn their job ids in order and each row
    holds its member's args and group index; a bad member far into it raises kombu's
    EncodeError, with the parts before it sent, and nothing is inserted."""
    from kombu.exceptions import EncodeError

    t = tasks(celery)
    result = group(t["add"].s(i, i) for i in range(1500)).apply_async()
    rows = db.execute("SELECT id, args, position FROM akadze.jobs ORDER BY id").fetchall()
    assert [member.job_id for member in result.results] == [row[0] for row in rows]
    assert [row[1]["args"] for row in rows] == [[i, i] for i in range(1500)]
    assert [row[2] for row in rows] == [*range(1499), None]  # the last: its own meta
    assert len({member.id for member in result.results}) == 1500
    db.execute("DELETE FROM akadze.jobs")
    members = [t["add"].s(i, i) for i in range(1500)]
    members[1300] = t["add"].s(object(), 1)
    members[1400] = t["add"].s("a\x00", 1)
    with pytest.raises(EncodeError, match="not JSON"):
        group(members).apply_async()
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)


def test_reused_rows_equal_rows_built_in_full(celery: Celery) -> None:
    """A group's members share one routed, configured row copied per member: each copy
    must be the row built for that member alone."""
    from akadze_compat.app.flow import Builder

    t = tasks(celery)
    celery.conf.task_routes = {"t.add": {"queue": "adds", "priority": 3}}
    canvas = group(t["add"].s(i, i) for i in range(3)).set(task_id="g-1")
    canvas.freeze()
    rows = []
    for reuse in (True, False):
        builder = Builder(celery, reuse=reuse)
        canvas.clone().to_flow(builder, after=[], many=False, failure="cancel")
        rows.append([(node.request, json.loads(node.request.meta))
                     for node in builder.workflow.nodes])
    reused, full = rows
    assert len(reused) == 3 and reused[0][0].queue == "adds" and reused[0][0].priority == 3
    assert [meta["celery"]["group_index"] for _, meta in reused] == [0, 1, 2]
    for (copy, copy_meta), (built, built_meta) in zip(reused, full, strict=True):
        assert copy_meta == built_meta
        assert copy == dataclasses.replace(built, meta=copy.meta)
