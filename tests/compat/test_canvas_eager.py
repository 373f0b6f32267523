"""Canvas without a database: how signatures compose and merge options, and canvases run
eagerly (``task_always_eager``), each checked against what Celery 5.7 gives for the same
program (its values, types and reprs are written out here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from akadze_compat import Celery, chain, chord, group
from akadze_compat.canvas import Signature
from akadze_compat.result import EagerResult, GroupResult


class Boom(Exception):
    """A task's own exception."""


@pytest.fixture
def app() -> Iterator[Celery]:
    made = Celery("p", set_as_current=False)
    made.conf.task_always_eager = True
    yield made
    made.close()


@pytest.fixture
def t(app: Celery) -> dict[str, Any]:
    seen: list[Any] = []

    @app.task(name="p.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="p.tsum")
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(name="p.fail")
    def fail(*args: Any) -> None:
        raise Boom("boom")

    @app.task(name="p.record")
    def record(*args: Any) -> None:
        seen.append(("record", *args))

    @app.task(name="p.on_error")
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        seen.append(("new", request.id, repr(exc), type(traceback).__name__, request.args))

    @app.task(name="p.on_error_old")
    def on_error_old(task_id: str) -> None:
        seen.append(("old", task_id))

    return {"add": add, "tsum": tsum, "fail": fail, "record": record, "on_error": on_error,
            "on_error_old": on_error_old, "seen": seen}


# --- composing, as Celery composes -----------------------------------------------------------


def test_the_operators_build_celerys_types(t: dict[str, Any]) -> None:
    add, tsum = t["add"], t["tsum"]
    pair = group(add.s(1, 1), add.s(2, 2))
    assert type(add.s(1, 1) | add.s(2)).__name__ == "_chain"
    assert type(pair | tsum.s()).__name__ == "_chord"
    assert type(add.s(1, 1) | pair).__name__ == "_chain"
    upgraded = add.s(1, 1) | pair | tsum.s()
    assert [type(step).__name__ for step in upgraded.tasks] == ["Signature", "_chord"]
    assert type(chain(pair, tsum.s())).__name__ == "_chord"
    assert type(chain(add.s(1, 1))).__name__ == "chain"
    assert type(pair | pair).__name__ == "_chord"
    assert type(add.s(1) | group(add.s(2))).__name__ == "_chain"  # a group of one unrolls
    spliced = (add.s(1, 1) | add.s(2)) | (add.s(3) | add.s(4))
    assert [step.args for step in spliced.tasks] == [(1, 1), (2,), (3,), (4,)]


def test_reprs_are_celerys(t: dict[str, Any]) -> None:
    add, tsum = t["add"], t["tsum"]
    pair = group(add.s(1, 1), add.s(2, 2))
    assert repr(add.s(1, 1) | add.s(2) | add.s(3)) == "p.add(1, 1) | add(2) | add(3)"
    assert repr(pair) == "group((p.add(1, 1), add(2, 2)))"
    assert repr(add.map([1, 2])) == "[p.add(x) for x in [1, 2]]"
    assert repr(add.starmap([(1, 2)])) == "[p.add(*x) for x in [(1, 2)]]"
    assert repr(chord(pair, tsum.s()) | add.s(1)) == \
        "%(p.tsum([add(1, 1), add(2, 2)]) | add(1))"


def test_options_and_partial_args_merge_as_celerys(t: dict[str, Any]) -> None:
    add = t["add"]
    sig = add.s(2).set(queue="a")
    assert sig._merge((1,), {}, {"queue": "b"}) == ((1, 2), {}, {"queue": "b"})
    assert add.s(1).clone(kwargs={"y": 3}).kwargs == {"y": 3}
    assert add.s(1, 2).clone(args=(5,)).args == (5, 1, 2)
    assert add.si(1, 2).clone((5,)).args == (1, 2)  # immutable: partial args ignored
    grouped = add.s(1).set(group_id="g1")
    assert grouped.clone(group_id="g2").options["group_id"] == "g1"  # never changed
    linked = add.s(1)
    linked.link(add.s(2))
    linked.link(add.s(2))
    assert linked.options == {"link": [add.s(2)]}  # Celery adds a callback once
    assert add.s(2, 2).replace(args=(1,)).args == (1,)
    on = add.s(1)
    assert on.on_error(t["on_error"].s()) is on and on.options["link_error"] == [
        t["on_error"].s()]


def test_freeze_keeps_an_id_and_groups_freeze_their_members(t: dict[str, Any]) -> None:
    add = t["add"]
    sig = add.s(1, 1)
    assert sig.freeze().id == sig.freeze().id == sig.id
    pair = group(add.s(1, 1), add.s(2, 2))
    frozen = pair.freeze()
    assert isinstance(frozen, GroupResult) and frozen.id == pair.options["task_id"]
    assert [member.id for member in frozen] == [task.id for task in pair.tasks]
    assert [task.options["group_index"] for task in pair.tasks] == [0, 1]


def test_a_chain_link_error_goes_to_every_step(t: dict[str, Any]) -> None:
    canvas = t["add"].s(1, 1) | t["add"].s(2)
    canvas.link_error(t["add"].si(0, 0))
    assert [step.options for step in canvas.unchain_tasks()] == [
        {"link_error": [t["add"].si(0, 0)]}] * 2


def test_a_signature_of_an_unknown_task_has_no_type(app: Celery) -> None:
    sig = Signature("elsewhere.task", (1,), app=app)
    assert sig.known_type is None
    with pytest.raises(KeyError):
        _ = sig.type


# --- running eagerly, as Celery does ------------------------------------------------------


def test_an_eager_chain_passes_results_and_links_parents(t: dict[str, Any]) -> None:
    result = (t["add"].s(1, 1) | t["add"].s(2) | t["add"].s(3))()
    assert isinstance(result, EagerResult) and result.get() == 7
    assert result.parent.get() == 4 and result.parent.parent.get() == 2


def test_an_eager_group_and_chord(t: dict[str, Any]) -> None:
    result = group(t["add"].s(1, 1), t["add"].s(2, 2))()
    assert isinstance(result, GroupResult) and result.get() == [2, 4]
    assert all(isinstance(member, EagerResult) for member in result)
    assert chord([t["add"].s(1, 1), t["add"].s(2, 2)])(t["tsum"].s()).get() == 6
    assert t["add"].chunks([(1, 2), (3, 4), (5, 6)], 2)().get() == [[3, 7], [11]]
    assert t["add"].starmap([(1, 2), (3, 4)]).apply_async().get() == [3, 7]


def test_eager_callbacks_and_errbacks(t: dict[str, Any]) -> None:
    seen = t["seen"]
    t["add"].apply_async((1, 2), link=t["record"].s("x"))
    assert seen == [("record", 3, "x")]
    seen.clear()
    failed = t["fail"].apply_async((1,), link_error=[t["on_error"].s(),
                                                     t["on_error_old"].s()])
    assert failed.state == "FAILURE"
    assert seen == [("new", failed.id, "Boom('boom')", "str", (1,)), ("old", failed.id)]


def test_errback_style_counts_what_the_signature_leaves(app: Celery) -> None:
    """Celery 5.7's rule: a mutable signature's own args and kwargs take their parameters
    first; only more than one parameter left makes an errback new style."""
    from akadze_compat.worker.canvas import new_style_errback

    @app.task(name="p.old_with_path")
    def old_with_path(task_id: str, path: str | None = None) -> None:
        pass

    @app.task(name="p.pair")
    def pair(a: Any, b: Any) -> None:
        pass

    def style(sig: Signature) -> str:
        new = new_style_errback(sig.known_type, sig.args, sig.kwargs,
                                immutable=bool(sig.immutable))
        return "new" if new else "old"

    assert style(old_with_path.s()) == "new"  # two parameters, as Celery counts them
    assert style(old_with_path.s(path="x")) == "old"
    assert style(old_with_path.s(nope=1)) == "new"  # does not fit: the function decides
    assert style(pair.s(1)) == "old"
    assert style(pair.si(1)) == "new"  # immutable: nothing is taken
    seen: list[Any] = []

    @app.task(name="p.record_old")
    def record_old(task_id: str, into: Any = None) -> None:
        seen.append(("old", task_id, into))

    @app.task(name="p.boom")
    def boom() -> None:
        raise Boom("boom")

    failed = boom.apply_async(link_error=record_old.s(into="x"))
    assert seen == [("old", failed.id, "x")]


def test_an_eager_chain_raises_at_the_step_after_a_failure(t: dict[str, Any]) -> None:
    seen = t["seen"]
    with pytest.raises(Boom):
        (t["add"].s(1, 1) | t["fail"].s() | t["add"].s(1)).on_error(
            t["on_error"].s()).apply_async()
    assert [(kind, exc, args) for kind, _, exc, _, args in seen] == [
        ("new", "Boom('boom')", (2,))]
    with pytest.raises(Boom):
        chord([t["add"].s(1, 1), t["fail"].s()], t["add"].s(1)).apply_async()
    ending = (t["add"].s(1, 1) | t["fail"].s()).apply_async()
    assert (ending.state, ending.parent.state) == ("FAILURE", "SUCCESS")
    mixed = group([t["add"].s(1, 1), t["fail"].s()]).apply_async()
    assert [member.state for member in mixed] == ["SUCCESS", "FAILURE"]


def test_chain_of_plain_signatures_is_the_fold_of_pipes(t: dict[str, Any]) -> None:
    steps = [t["add"].s(i) for i in range(1, 5)]
    made = chain(step for step in steps)
    folded = steps[0] | steps[1] | steps[2] | steps[3]
    assert type(made) is type(folded) and made == folded
    assert all(a is not b for a, b in zip(made.tasks, steps, strict=True))  # copies
    assert made(0).get() == 10


def test_an_eager_chords_link_options_add_to_its_bodys_own(t: dict[str, Any]) -> None:
    # As Celery 5.7's eager chord (_add_body_callbacks before apply): the body keeps its
    # own callback, the chord's runs too, and the caller's body is left as it was.
    body = t["tsum"].s()
    body.link(t["record"].si("own"))
    result = chord([t["add"].si(1, 1), t["add"].si(2, 2)], body).apply_async(
        link=t["record"].s())
    assert result.get() == 6
    assert sorted(t["seen"], key=str) == [("record", "own"), ("record", 6)]
    assert body.options["link"] == [t["record"].si("own")]


def test_a_chains_arguments_reach_a_chord_that_leads_it(t: dict[str, Any]) -> None:
    # Celery 5.7's chain.apply gives its arguments to the first step's apply: a chord's
    # header takes them there (its t/integration test_chord_in_chain_with_args).
    leading = chain(chord([t["add"].s(1), t["add"].s(2)], t["tsum"].s()), t["add"].s(100))
    assert leading.apply(args=(10,)).get() == 123
    assert chain(t["add"].si(1, 1), t["add"].s(3)).apply(args=(99,)).get() == 5
