"""``Task.replace(sig)`` on a real Postgres and worker: the replacement takes the task's id,
its place in a chain or chord and its callbacks, in the transaction that ends the task.

Celery 5.7's ``Task.replace`` / ``on_replace`` (celery/app/task.py) is the reference: the
replacement is frozen with the task's id, a group is given a ``celery.accumulate`` body,
errbacks are linked to it, the rest of the chain runs after it, ``Ignore`` is raised.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from akadze_compat import Celery, chain, chord, group, states
from akadze_compat.exceptions import ImproperlyConfigured
from tests.compat.conftest import work


class Boom(Exception):
    """The replacement's own failure."""


def tasks(app: Celery) -> dict[str, Any]:
    seen: list[Any] = []

    @app.task(name="r.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="r.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="r.tsum")
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(name="r.fail")
    def fail(*args: Any) -> None:
        raise Boom("boom")

    @app.task(name="r.by_add", bind=True)
    def by_add(self: Any, x: int, y: int) -> Any:
        seen.append(("ran", self.request.id))
        return self.replace(add.s(x, y))

    @app.task(name="r.by_chain", bind=True)
    def by_chain(self: Any, x: int) -> Any:
        return self.replace(add.s(x, 1) | mul.s(10))

    @app.task(name="r.by_group", bind=True)
    def by_group(self: Any, n: int) -> Any:
        return self.replace(group(add.s(i, i) for i in range(n)))

    @app.task(name="r.by_chain_to_group", bind=True)
    def by_chain_to_group(self: Any) -> Any:  # Celery's t/integration task of that name
        return self.replace(chain(add.s(1, 2), group(add.s(1), add.s(1))))

    @app.task(name="r.by_fail", bind=True)
    def by_fail(self: Any) -> Any:
        return self.replace(fail.s())

    @app.task(name="r.by_chord_sig", bind=True)
    def by_chord_sig(self: Any) -> Any:
        return self.replace(add.s(1, 1).set(chord="x"))

    @app.task(name="r.on_error")
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        seen.append(("errback", request.id, type(exc).__name__))

    @app.task(name="r.record")
    def record(value: Any) -> None:
        seen.append(("record", value))

    return {"add": add, "mul": mul, "tsum": tsum, "by_add": by_add, "by_chain": by_chain,
            "by_group": by_group, "by_chain_to_group": by_chain_to_group, "by_fail": by_fail,
            "by_chord_sig": by_chord_sig, "on_error": on_error, "record": record,
            "seen": seen}


async def test_the_callers_result_gives_the_replacements(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    result = t["by_add"].delay(2, 3)
    await work(celery, lambda: result.ready())
    assert result.get(timeout=5) == 5
    assert result.state == states.SUCCESS
    # The same task id read afresh (no job id known) finds the replacement too.
    assert celery.AsyncResult(result.id).get(timeout=5) == 5
    rows = db.execute("SELECT task, state, meta->>'task_id', meta ? 'replaced_by' "
                      "FROM akadze.jobs ORDER BY id").fetchall()
    # The original ended with the hand-over, the replacement carries its id (derived from
    # the original's job id: delay() stored none); the body ran once.
    assert rows == [("r.by_add", "succeeded", None, True),
                    ("r.add", "succeeded", result.id, False)]
    assert t["seen"] == [("ran", result.id)]


async def test_a_chains_rest_runs_after_the_replacement(celery: Celery) -> None:
    t = tasks(celery)
    result = (t["add"].s(1, 1) | t["by_chain"].s() | t["mul"].s(2) | t["add"].s(5))()
    await work(celery, lambda: result.ready())
    # (1 + 1) -> replaced by add(2, 1) | mul(10) = 30 -> * 2 = 60 -> + 5 = 65
    assert result.get(timeout=5) == 65
    assert result.parent.parent.get(timeout=5) == 30


async def test_a_link_callback_gets_the_replacements_result(celery: Celery) -> None:
    t = tasks(celery)
    result = t["by_add"].apply_async((20, 22), link=t["record"].s())
    await work(celery, lambda: ("record", 42) in t["seen"])
    assert result.get(timeout=5) == 42
    assert t["seen"].count(("record", 42)) == 1


async def test_a_replaced_group_gives_its_list(celery: Celery) -> None:
    t = tasks(celery)
    result = (t["by_group"].s(3) | t["tsum"].s())()
    await work(celery, lambda: result.ready())
    assert result.parent.get(timeout=5) == [0, 2, 4]
    assert result.get(timeout=5) == 6


async def test_a_chain_ending_in_a_group_gives_the_groups_list(celery: Celery) -> None:
    # As Celery: the chain's last group becomes a chord giving its results' list.
    t = tasks(celery)
    result = (t["by_chain_to_group"].s() | t["tsum"].s())()
    await work(celery, lambda: result.ready())
    assert result.parent.get(timeout=5) == [4, 4]
    assert result.get(timeout=5) == 8


async def test_a_chord_member_replaced_keeps_its_place(celery: Celery) -> None:
    t = tasks(celery)
    result = chord([t["add"].s(1, 1), t["by_add"].s(10, 10), t["add"].s(3, 3)],
                   t["record"].s())()
    await work(celery, lambda: result.ready())
    assert ("record", [2, 20, 6]) in t["seen"]


async def test_the_replacements_failure_reaches_the_errbacks_and_stops_the_chain(
        celery: Celery, db: psycopg.Connection) -> None:
    t = tasks(celery)
    canvas = t["by_fail"].si() | t["add"].s(1)
    canvas.link_error(t["on_error"].s())
    result = canvas.apply_async()
    await work(celery, lambda: any(entry[0] == "errback" for entry in t["seen"]))
    replaced = result.parent
    assert replaced.state == states.FAILURE
    with pytest.raises(Boom):
        replaced.get(timeout=5)
    assert [entry for entry in t["seen"] if entry[0] == "errback"] == [
        ("errback", replaced.id, "Boom")]
    assert db.execute("SELECT state FROM akadze.jobs WHERE task = 'r.add'").fetchone() \
        in (("cancelled",), ("failed",))


async def test_a_replacement_in_a_chord_is_refused(celery: Celery) -> None:
    t = tasks(celery)
    result = t["by_chord_sig"].delay()
    await work(celery, lambda: result.ready())
    with pytest.raises(ImproperlyConfigured):
        result.get(timeout=5)


def test_eager_replace_returns_the_replacements_result(celery: Celery) -> None:
    celery.conf.task_always_eager = True
    t = tasks(celery)
    assert t["by_chain"].delay(4).get() == 50
    assert t["by_group"].delay(2).get() == [0, 2]


def test_an_empty_chain_is_refused(celery: Celery) -> None:
    t = tasks(celery)

    @celery.task(name="r.by_empty", bind=True)
    def by_empty(self: Any) -> Any:
        return self.replace(chain())

    celery.conf.task_always_eager = True
    with pytest.raises(ImproperlyConfigured):
        by_empty.delay().get()
    assert t


async def test_a_group_member_replaced_and_a_replacement_replaced_again(
        celery: Celery) -> None:
    t = tasks(celery)

    @celery.task(name="r.twice", bind=True)
    def twice(self: Any, x: int) -> Any:
        return self.replace(t["by_add"].s(x, x))

    result = group(t["add"].s(1, 1), twice.s(5), t["by_add"].s(3, 4)).delay()
    await work(celery, lambda: result.ready())
    assert result.get(timeout=5) == [2, 10, 7]
    assert [member.state for member in result.results] == [states.SUCCESS] * 3


async def test_build_graph_has_the_result_and_its_children(celery: Celery) -> None:
    from akadze_compat.utils.graph import DependencyGraph

    t = tasks(celery)
    result = (t["add"].s(1, 1) | t["mul"].s(3) | t["add"].s(4))()
    head = result.parent.parent
    await work(celery, lambda: result.ready())
    graph = head.build_graph()
    assert isinstance(graph, DependencyGraph)
    assert list(graph) == [head, result.parent, result]
    assert graph[head] == [result.parent] and graph[result] == []
    assert graph.topsort() == [result, result.parent, head]  # what each depends on first
    assert list(graph.edges()) == [head, result.parent]
    assert graph.valency_of(head) == 2
    assert head.graph is head.graph and len(head.graph) == 3
    assert head.get_leaf() == 10


def test_dependency_graph_orders_detects_cycles_and_draws() -> None:
    import io

    from akadze_compat.utils.graph import CycleError, DependencyGraph, GraphFormatter

    graph = DependencyGraph([("app", ["db", "cache"]), ("cache", ["db"]), ("db", [])])
    order = graph.topsort()
    assert order.index("db") < order.index("cache") < order.index("app")
    out = io.StringIO()
    graph.to_dot(out, GraphFormatter(root="app"))
    text = out.getvalue()
    assert text.startswith("digraph dependencies {") and '"app" -> "db"' in text
    assert '"app" [shape="box", style="filled"]' in text
    graph.add_edge("db", "app")
    with pytest.raises(CycleError):
        graph.topsort()


async def test_an_async_task_replaces_itself(celery: Celery) -> None:
    t = tasks(celery)

    @celery.task(name="r.async_by_add", bind=True)
    async def async_by_add(self: Any, x: int) -> Any:
        return self.replace(t["add"].s(x, 100))

    result = (async_by_add.s(1) | t["mul"].s(2))()
    await work(celery, lambda: result.ready())
    assert result.get(timeout=5) == 202


async def test_a_task_replaced_by_a_chord_passes_on_the_bodys_result(celery: Celery) -> None:
    t = tasks(celery)

    @celery.task(name="r.by_chord", bind=True)
    def by_chord(self: Any, n: int) -> Any:
        return self.replace(chord([t["add"].s(i, 1) for i in range(n)], t["tsum"].s()))

    result = (by_chord.s(3) | t["mul"].s(2))()
    await work(celery, lambda: result.ready())
    assert result.parent.get(timeout=5) == 6  # 1 + 2 + 3
    assert result.get(timeout=5) == 12
