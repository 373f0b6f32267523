"""Canvas programs run under real Celery 5.7 (Redis) and under akadze_compat (Postgres).

Written as a Celery user writes them: ``from celery import ...``. For our side,
``tests/compat/canvas_differential.py`` copies this file to ``canvasprog.py`` with its
``celery`` imports renamed to ``akadze_compat`` (what a migrating user changes) and nothing
else; for Celery the file is copied unchanged. The same ``canvasprog`` module is the worker's
app (``-A canvasprog``) and the client's.

Each ``@program`` builds a canvas, runs it on the live worker and returns a JSON-serialisable
observation; ``canvas_runner.py`` gives it a ``ctx`` (waiting, describing results, reading the
files errbacks and callbacks write) and replaces task ids by where they were seen
(``<res.parent>``), so that the two sides' observations compare field by field. Programs that
need the queue before the worker starts name a ``setup`` that the runner calls first.

The cases start from Celery's own ``t/integration/test_canvas.py`` (rewritten, not copied),
then add what it leaves out: states of every result, errback call styles, result shapes,
partial arguments, immutability, options and revokes.

Imports that only some programs need (``celery.result``, ``celery.exceptions``) are made
inside those programs, so that a name our side lacks fails that program only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable

from celery import Celery, chain, chord, group, signature

app = Celery("canvasprog", broker=os.environ["CANVAS_BROKER_URL"],
             backend=os.environ.get("CANVAS_RESULT_BACKEND") or None)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=600,
    worker_prefetch_multiplier=1,
)
_prefix = os.environ.get("CANVAS_REDIS_PREFIX")
if _prefix:  # Celery on a shared Redis: every key of this session under one prefix
    app.conf.broker_transport_options = {"global_keyprefix": _prefix}
    app.conf.result_backend_transport_options = {"global_keyprefix": _prefix}

# A wait that should succeed (the programs that expect a timeout pass their own): room for
# a real Celery worker on a loaded machine, where 10 s once ran out for a four-step chain.
TIMEOUT = 30.0


class ExpectedException(Exception):
    """What ``fail`` raises."""


def _append(path: str, entry: dict) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(entry, default=repr) + "\n")


# --- tasks --------------------------------------------------------------------------------------

@app.task
def identity(x):
    return x


@app.task
def add(x, y, z=None):
    return x + y + z if z else x + y


@app.task
def mul(x, y):
    return x * y


@app.task
def tsum(nums):
    return sum(nums)


@app.task
def xsum(nums):
    return sum(sum(num) if isinstance(num, Iterable) else num for num in nums)


@app.task
def add_to_all(nums, val):
    return [num + val for num in nums]


@app.task
def record(*args, **kwargs):
    """Returns what it was called with."""
    return {"args": list(args), "kwargs": kwargs}


@app.task
def fail(*args):
    raise ExpectedException(f"expected failure {list(args)!r}")


@app.task
def sleepy(seconds, value):
    time.sleep(seconds)
    return value


@app.task
def note(*args, path, label):
    """A callback: writes ``label`` and the arguments it got to ``path``."""
    _append(path, {"label": label, "args": list(args)})
    return label


@app.task
def on_error_new(request, exc, traceback, path=None):
    """A new-style errback: Celery calls it with the failed task's request and exception."""
    _append(path, {"style": "new", "id": request.id, "task": request.task,
                   "exc_type": type(exc).__name__, "exc": str(exc),
                   "has_traceback": bool(traceback)})


@app.task
def on_error_old(task_id, path=None):
    """An old-style errback: Celery sends it as a task with the failed task's id."""
    _append(path, {"style": "old", "id": task_id})


@app.task(bind=True)
def whoami(self, i):
    """The ids Celery gives a task's request: its root and its parent."""
    return {"i": i, "root_id": self.request.root_id, "parent_id": self.request.parent_id}


@app.task
def wait_inside(x):
    """Calls ``.get()`` on another task from inside a task, which Celery refuses."""
    return add.delay(x, x).get(timeout=5)


@app.task(bind=True)
def replaced_by_add(self, x, y):
    """Replaces itself with ``add(x, y)`` (Celery's ``Task.replace``)."""
    return self.replace(add.s(x, y))


@app.task(bind=True)
def replaced_by_chain(self, x):
    """Replaces itself with a chain: ``add(x, 1) | mul(10)``."""
    return self.replace(add.s(x, 1) | mul.s(10))


@app.task(bind=True)
def replaced_by_group(self, n):
    """Replaces itself with a group, which Celery gives an ``accumulate`` body."""
    return self.replace(group(add.s(i, i) for i in range(n)))


@app.task(bind=True)
def replaced_by_fail(self):
    """Replaces itself with a task that fails."""
    return self.replace(fail.s("replaced"))


# --- the program registry -----------------------------------------------------------------------

PROGRAMS: dict = {}


def program(fun=None, *, setup=None):
    """Register ``fun(ctx)`` (or ``fun(ctx, prepared)`` with ``setup(ctx) -> prepared``, which
    runs before the worker starts)."""
    def register(fun):
        PROGRAMS[fun.__name__] = (fun, setup)
        return fun

    return register(fun) if fun is not None else register


# --- single tasks: link, link_error, options ----------------------------------------------------

@program
def task_link_callback(ctx):
    path = ctx.path("calls")
    res = add.apply_async((2, 2), link=note.s(path=path, label="cb"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 1), "res": ctx.tree(res)}


@program
def task_link_two_callbacks_immutable(ctx):
    path = ctx.path("calls")
    res = add.apply_async((2, 3), link=[note.s(path=path, label="mutable"),
                                        note.si(7, path=path, label="immutable")])
    return {"get": ctx.get(res), "calls": ctx.lines(path, 2, sort_by="label")}


@program
def task_link_error_new_style(ctx):
    path = ctx.path("errors")
    res = fail.apply_async(("boom",), link_error=on_error_new.s(path=path))
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1), "res": ctx.tree(res)}


@program
def task_link_error_old_style(ctx):
    path = ctx.path("errors")
    res = fail.apply_async(("boom",), link_error=on_error_old.s(path=path))
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1), "res": ctx.tree(res)}


@program
def task_link_error_on_signature(ctx):
    path = ctx.path("errors")
    sig = fail.s("via signature")
    sig.link_error(on_error_old.s(path=path))
    res = sig.delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def task_success_skips_errback(ctx):
    path = ctx.path("errors")
    res = add.apply_async((1, 1), link_error=on_error_new.s(path=path))
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 0)}


@program
def signature_partial_clone_and_call(ctx):
    partial = add.s(2)
    return {
        "delay_prepends": ctx.get(partial.delay(1)),
        "apply_async_prepends": ctx.get(partial.apply_async((10,))),
        "clone_prepends": ctx.get(partial.clone(args=(5,)).delay()),
        "immutable_ignores": ctx.get(add.si(2, 2).apply_async((100,))),
        "kwargs_merge": ctx.get(add.s(1, 2).apply_async(kwargs={"z": 3})),
        "called_inline": ctx.outcome(lambda: partial(40)),
        "signature_by_name": ctx.get(signature("canvasprog.add", args=(3, 4)).delay()),
        "record_partial": ctx.get(record.s(1, k=2).delay(0, j=3)),
    }


@program
def signature_set_countdown(ctx):
    started = time.monotonic()
    res = add.s(1, 1).set(countdown=1.5).apply_async()
    time.sleep(0.5)
    early = res.ready()
    value = ctx.get(res)
    return {"ready_at_0.5s": early, "get": value,
            "waited_at_least_1.4s": time.monotonic() - started >= 1.4}


@program
def signature_freeze_id(ctx):
    sig = add.s(1, 1)
    frozen = sig.freeze()
    res = sig.delay()
    return {"same_id": frozen.id == res.id, "get": ctx.get(res)}


def _id_shape(task_id):
    import re
    import uuid

    return {"type": type(task_id).__name__,
            "uuid4": bool(re.fullmatch(r"[0-9a-f-]{36}", str(task_id)))
            and uuid.UUID(str(task_id)).version == 4}


@program
def task_id_is_a_uuid4_string(ctx):
    res = add.delay(2, 2)
    return {"id": _id_shape(res.id), "get": ctx.get(res)}


@program
def chain_ids_are_uuid4_strings(ctx):
    res = (add.s(1, 1) | add.s(1))()
    return {"get": ctx.get(res), "last": _id_shape(res.id), "first": _id_shape(res.parent.id)}


@program
def result_get_inside_task_refused(ctx):
    return {"get": ctx.get(wait_inside.delay(1))}


# --- chains -------------------------------------------------------------------------------------

@program
def chain_simple(ctx):
    res = (add.s(4, 4) | add.s(8) | add.s(16))()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_single_task(ctx):
    res = chain(add.s(3, 4))()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_of_chain_with_a_single_task(ctx):
    res = chain([chain(identity.s(42))]).apply_async()
    return {"get": ctx.get(res)}


@program
def chain_partial_args_and_kwargs(ctx):
    res = (add.s(1, 2) | add.s(3, z=10) | record.s(1, k=2)).apply_async()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_called_with_args(ctx):
    res = chain(add.s(4), mul.s(2)).apply_async((1,))
    return {"get": ctx.get(res)}


@program
def chain_immutable_steps(ctx):
    res = (add.si(1, 1) | add.si(2, 2) | record.s() | record.si("fixed"))()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_failure_in_middle(ctx):
    res = chain(add.s(1, 2), fail.s(), add.s(3, 4))()
    return {"get": ctx.get(res), "parent_get": ctx.get(res.parent),
            "res": ctx.tree(res, settle=3)}


@program
def chain_link_error_on_apply_async(ctx):
    path = ctx.path("errors")
    res = chain(add.s(1, 2), fail.s(), add.s(3, 4)).apply_async(
        link_error=on_error_new.s(path=path))
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1), "res": ctx.tree(res, settle=3)}


@program
def chain_on_error_old_style(ctx):
    path = ctx.path("errors")
    res = (add.s(1, 2) | fail.s() | add.s(3)).on_error(on_error_old.s(path=path)).delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chain_link_callback_on_last_step(ctx):
    path = ctx.path("calls")
    res = (add.s(1, 1) | mul.s(5)).apply_async(link=note.s(path=path, label="done"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 1)}


@program
def chain_children_errbacks_only_first_runs(ctx):
    path = ctx.path("errors")
    step = fail.si("step")
    step.link_error(on_error_old.s(path=path))
    res = chain(step.clone() for _ in range(4))()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1), "res": ctx.tree(res, settle=3)}


@program
def chain_countdown_on_second_step(ctx):
    started = time.monotonic()
    res = (add.si(1, 1) | add.si(2, 2).set(countdown=1.5))()
    time.sleep(0.6)
    early = {"head_ready": res.parent.ready(), "tail_ready": res.ready()}
    value = ctx.get(res)
    return {"at_0.6s": early, "get": value,
            "waited_at_least_1.4s": time.monotonic() - started >= 1.4}


@program
def chain_root_and_parent_ids(ctx):
    res = (whoami.si(1) | whoami.si(2) | whoami.si(3))()
    ctx.get(res)
    return {"steps": [ctx.get(res.parent.parent), ctx.get(res.parent), ctx.get(res)],
            "res": ctx.tree(res)}


@program
def chain_group_in_middle(ctx):
    res = chain(identity.s(42), group(identity.s(), identity.s()), identity.s()).delay()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_group_last(ctx):
    res = chain(identity.s(42), group(identity.s(), identity.s())).delay()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_group_then_task_becomes_chord(ctx):
    res = (add.s(2, 2) | group(add.s(i) for i in range(4)) | add_to_all.s(8))()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chain_group_then_task_with_kwargs(ctx):
    c = add.s(2, 2) | group(add.s(i) for i in range(4)) | add_to_all.s(8)
    return {"get": ctx.get(c.apply_async(kwargs={"z": 1}))}


@program
def chain_inside_group_receives_arguments(ctx):
    res = (add.s(5, 6) | group((add.s(1) | add.s(2), add.s(3))))()
    return {"get": ctx.get(res)}


@program
def chain_of_groups_and_chords(ctx):
    c = add.si(1, 0) | group(add.s(1), add.s(1)) | group(tsum.s(), tsum.s()) | tsum.s()
    return {"get": ctx.get(c())}


@program
def chain_of_chords_with_two_tasks(ctx):
    c = (add.si(1, 0) | group(add.s(1), add.s(1)) | tsum.s() | add.s(1)
         | chord(group(add.s(1), add.s(1)), tsum.s()))
    return {"get": ctx.get(c())}


@program
def chain_of_explicit_chords(ctx):
    first = chain(
        chord(group(add.si(1, 0), add.si(1, 0)), tsum.s()),
        chord(group(add.s(1), add.s(1)), tsum.s()),
        chord(group(add.s(0), add.s(0)), tsum.s()),
    )
    second = chain(
        chord(group(add.s(10), add.s(10)), tsum.s()),
        chord(group(add.s(0), add.s(0)), tsum.s()),
        chord(group(add.s(1), add.s(1)), tsum.s()),
    )
    return {"get": ctx.get((first | second)())}


@program
def chain_nested_group_chain(ctx):
    c = chain(
        add.si(1, 0),
        group(add.si(1, 100), chain(add.si(1, 200), group(add.si(1, 1000), add.si(1, 2000)))),
        add.si(1, 10),
    )
    return {"get": ctx.get(c())}


@program
def chain_failure_before_group(ctx):
    res = (add.s(1, 1) | fail.s() | group(add.s(1), add.s(1))).delay()
    return {"get": ctx.get(res, timeout=5)}


@program
def chain_failure_inside_final_group(ctx):
    res = (add.s(1, 1) | add.s(1) | group(add.s(1), fail.s())).delay()
    return {"get": ctx.get(res), "res": ctx.tree(res, settle=3)}


# --- groups and result sets ---------------------------------------------------------------------

@program
def group_simple(ctx):
    res = group(add.s(i, i) for i in range(4))()
    return {"get": ctx.get(res), "res": ctx.tree(res), "shape": ctx.shape(res)}


@program
def group_while_a_member_runs(ctx):
    res = group(sleepy.si(1.5, 1), identity.si(2)).delay()
    time.sleep(0.7)
    during = ctx.shape(res)
    return {"during": during, "get": ctx.get(res), "after": ctx.shape(res),
            "iterates_members": [member.get(timeout=TIMEOUT) for member in res]}


@program
def group_order_is_position_not_completion(ctx):
    res = group(sleepy.s(0.1 * (4 - i), i) for i in range(5)).delay()
    return {"get": ctx.get(res), "shape": ctx.shape(res)}


@program
def group_called_with_partial_args(ctx):
    res = group(add.s(1), add.s(2), record.s("x")).apply_async((10,))
    return {"get": ctx.get(res)}


@program
def group_member_fails(ctx):
    res = group(add.s(1, 2), fail.s("member"), add.s(3, 4))()
    raised = ctx.get(res)
    ctx.settle(res)
    return {"get": raised, "join_no_propagate": ctx.outcome(
        lambda: res.join(propagate=False, timeout=TIMEOUT)), "shape": ctx.shape(res),
        "res": ctx.tree(res)}


@program
def group_nested_unrolls(ctx):
    res = group(add.si(1, 10), group(add.si(1, 100), group(add.si(1, 1000), add.si(1, 2000))))()
    return {"get": ctx.get(res), "shape": ctx.shape(res)}


@program
def group_of_chains(ctx):
    res = group(add.s(1, 1) | mul.s(10), chain(add.s(2, 2), mul.s(10)), identity.si(7))()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def group_of_chain_ending_in_group(ctx):
    res = group(identity.si(1), identity.si(2),
                chain(identity.si(5), group([identity.si(3), identity.si(4)]))).delay()
    return {"get": ctx.get(res)}


@program
def group_empty(ctx):
    res = group([]).apply_async()
    return {"get": ctx.get(res), "shape": ctx.shape(res)}


@program
def group_link_error_each_failing_member(ctx):
    path = ctx.path("errors")
    sig = group(fail.s("first"), identity.si(42), fail.s("third"))
    sig.link_error(on_error_new.s(path=path))
    res = sig.delay()
    got = ctx.get(res)
    # Which failure get() raises is whichever member failed first (Celery's native join on
    # Redis reads results as they arrive; both runs were seen): only its type is compared.
    if isinstance(got, dict) and isinstance(got.get("raised"), dict):
        got["raised"].pop("message", None)
    return {"get": got, "errbacks": ctx.lines(path, 2, sort_by="exc")}


@program
def group_link_callback(ctx):
    path = ctx.path("calls")
    sig = group(identity.si(42), identity.si(1337))
    sig.link(note.si(path=path, label="group done"))
    res = sig.delay()
    return {"get": ctx.get(res), "calls": ctx.lines(path, 1)}


@program
def group_result_save_and_restore(ctx):
    from celery.result import GroupResult

    res = group(add.s(1, 1), add.s(2, 2)).delay()
    res.save()
    restored = GroupResult.restore(res.id)
    return {"restored_len": len(restored.results), "get": ctx.get(restored),
            "same_ids": [r.id for r in restored.results] == [r.id for r in res.results]}


@program
def result_set_of_delays(ctx):
    from celery.result import ResultSet

    rs = ResultSet([add.delay(1, 1), add.delay(2, 2)])
    rs.add(add.delay(3, 3))
    failing = ResultSet([fail.delay("rs"), add.delay(1, 1)])
    ctx.outcome(lambda: failing.join(propagate=False, timeout=TIMEOUT))
    return {"get": ctx.get(rs), "len": len(rs), "failing": ctx.shape(failing),
            "failing_get": ctx.get(failing)}


# --- chords -------------------------------------------------------------------------------------

@program
def chord_simple(ctx):
    res = chord((add.s(i, i) for i in range(5)), tsum.s())()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chord_header_then_body_call(ctx):
    res = chord([add.s(1, 1), add.s(2, 2)])(tsum.s())
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chord_order_is_header_order(ctx):
    res = chord((sleepy.si(0.1 * (4 - i), i) for i in range(5)), identity.s())()
    return {"get": ctx.get(res)}


@program
def chord_group_pipe_task(ctx):
    sig = group(add.s(i, i) for i in range(3)) | tsum.s()
    return {"is_chord": isinstance(sig, chord), "get": ctx.get(sig())}


@program
def chord_single_task_header(ctx):
    return {"chord": ctx.get(chord([add.s(2, 5)], body=add_to_all.s(9))()),
            "group_pipe": ctx.get((group([add.s(2, 5)]) | add_to_all.s(9))())}


@program
def chord_empty_header(ctx):
    return {"chord": ctx.get(chord([], body=add_to_all.s(9))()),
            "group_pipe": ctx.get((group([]) | add_to_all.s(9))())}


@program
def chord_of_chords(ctx):
    nested = chord([chord([add.s(1, 2), add.s(3, 4)], add.s([5])),
                    chord([add.s(6, 7)], add.s([10]))], add_to_all.s(["A"]))
    piped = group([group([add.s(1, 2), add.s(3, 4)]) | add.s([5]),
                   group([add.s(6, 7)]) | add.s([10])]) | add_to_all.s(["A"])
    deep = group([group([group([group([add.s(1, 2)]) | add.s([3])]) | add.s([4])])
                  | add.s([5])]) | add.s([6])
    return {"nested": ctx.get(nested()), "piped": ctx.get(piped()), "deep": ctx.get(deep())}


@program
def chord_parallel_in_group(ctx):
    g = group(chord(group(add.s(1, 2), add.s(3, 4)), tsum.s()),
              chord(group(add.s(1, 2), add.s(3, 4)), tsum.s()))
    res = g.delay()
    return {"get": ctx.get(res), "res": ctx.tree(res)}


@program
def chord_in_chords_with_chains(ctx):
    inner = chain(add.si(1, 2), chord(group([add.si(1, 2), add.si(1, 2)]), add.si(1, 2)))
    res = chord(group([inner, inner.clone()]), add.si(2, 2)).delay()
    return {"get": ctx.get(res)}


@program
def chord_chain_chord_chain(ctx):
    c = chain(identity.si(1), chord([identity.si(2), chain(identity.si(3), chord(
        [identity.si(4), identity.si(5)], identity.si(6)))], identity.si(7)))
    return {"get": ctx.get(c.delay())}


@program
def chord_header_group_unrolls(ctx):
    res = chord((group(identity.si(42), identity.si(43)),), identity.s()).delay()
    return {"get": ctx.get(res)}


@program
def chord_header_member_fails(ctx):
    res = chord([add.s(1, 2), fail.s("header"), add.s(3, 4)], tsum.s())()
    return {"get": ctx.get(res), "res": ctx.tree(res, settle=3)}


@program
def chord_header_fails_body_errback(ctx):
    path = ctx.path("errors")
    res = chord([add.s(1, 2), fail.s("header")],
                identity.s().on_error(on_error_old.s(path=path)))()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_header_fails_link_error_new_style(ctx):
    path = ctx.path("errors")
    sig = chord([identity.si(1), fail.s("header")], identity.s())
    sig.link_error(on_error_new.s(path=path))
    res = sig.delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_body_fails(ctx):
    path = ctx.path("errors")
    sig = chord([identity.si(42)], fail.s())
    sig.link_error(on_error_new.s(path=path))
    res = sig.delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1), "res": ctx.tree(res)}


@program
def chord_header_chain_fails(ctx):
    res = chord((chain(identity.si(42), fail.s(), identity.si(42)),), identity.s()).delay()
    return {"get": ctx.get(res)}


@program
def chain_failure_before_chord_errback_once(ctx):
    # The chain's errback is linked to every step and to the chord's body; the body never
    # runs and the errback is called once, for the failed step.
    path = ctx.path("errors")
    res = chain(add.s(1, 1), fail.s(), chord([add.s(1), add.s(2)], tsum.s())).apply_async(
        link_error=on_error_old.s(path=path))
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1),
            "res": ctx.tree(res, settle=3)}


@program
def chain_failure_before_two_chords(ctx):
    path = ctx.path("errors")
    sig = chain(fail.si(), chord([add.si(1, 1)], tsum.s()), chord([add.s(1)], tsum.s()))
    sig.link_error(on_error_new.s(path=path))
    res = sig.delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_header_chain_fails_before_its_own_chord(ctx):
    # Celery's test_chord_unlock_with_failed_task_in_nested_chain_member: the failure is
    # the outer header's, so the outer body fails, with its errback.
    path = ctx.path("errors")
    body = identity.s()
    body.link_error(on_error_old.s(path=path))
    res = chain(group(identity.si(1),
                      chain(fail.si(), group(identity.si(2), identity.si(3)), identity.si(4))),
                body).delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_of_implicit_chords_header_failure(ctx):
    # Celery's test_chain_of_implicit_chords_body_failure['header']: the inner chord's
    # header fails; its body's first step fails with ChordError and the errback linked to
    # that body's chain runs once.
    path = ctx.path("errors")
    inner_body = chain(tsum.s(), group(add.s(1), add.s(2)), tsum.s())
    inner_body.link_error(on_error_old.s(path=path))
    res = chord([add.si(1, 1)],
                chain(tsum.s(), chord(group(fail.si(), add.si(1, 2)), inner_body))).delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_of_implicit_chords_body_failure(ctx):
    # ...['body']: the inner body's first step fails itself.
    path = ctx.path("errors")
    inner_body = chain(fail.si(), group(add.s(1), add.s(2)), tsum.s())
    inner_body.link_error(on_error_old.s(path=path))
    res = chord([add.si(1, 1)],
                chain(tsum.s(), chord(group(add.si(1, 2)), inner_body))).delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_of_chords_header_failure(ctx):
    # A chord whose body is a chord: the outer header's failure fails the inner chord.
    path = ctx.path("errors")
    inner = chord([add.s(1), add.s(2)], tsum.s())
    inner.link_error(on_error_old.s(path=path))
    res = chord([add.si(1, 1), fail.si()], inner).delay()
    return {"get": ctx.get(res), "errbacks": ctx.lines(path, 1)}


@program
def chord_link_error_option_with_group_body_link_error(ctx):
    # Celery's test_link_error_option_with_link_error_of_group_body: the group's own
    # link_error replaces its tasks' errbacks, so the chord's goes into it.
    path = ctx.path("calls")
    body = group(fail.s(), tsum.s()).set(link_error=note.si(path=path, label="group"))
    res = chord([add.si(1, 1)], body).apply_async(
        link_error=note.si(path=path, label="chord"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 2, sort_by="label")}


@program
def chord_link_error_option_with_chord_in_group_body(ctx):
    # ...test_link_error_option_runs_once_for_chord_in_group_body_with_link_error.
    path = ctx.path("calls")
    body = group(chord([add.si(1, 1)], group(fail.s(), tsum.s()))).set(
        link_error=note.si(path=path, label="group"))
    res = chord([add.si(1, 1)], body).apply_async(
        link_error=note.si(path=path, label="chord"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 2, sort_by="label")}


@program
def chord_link_callback_on_body(ctx):
    path = ctx.path("calls")
    res = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply_async(
        link=note.s(path=path, label="body done"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 1)}


# --- chunks, map, starmap -----------------------------------------------------------------------

@program
def chunks_of_add(ctx):
    sig = add.chunks([(i, i) for i in range(6)], 2)
    res = sig()
    return {"get": ctx.get(res), "shape": ctx.shape(res),
            "as_group": ctx.get(add.chunks([(i, i) for i in range(4)], 3).group()())}


@program
def map_and_starmap(ctx):
    return {"map": ctx.get(tsum.map([[1, 2], [3, 4], []]).delay()),
            "starmap": ctx.get(add.starmap([(1, 2), (3, 4)]).delay()),
            "map_result": ctx.tree(ctx.wait(identity.map([1, 2]).delay()))}


@program
def result_children_and_collect(ctx):
    res = (add.s(1, 1) | add.s(2))()
    ctx.get(res)
    head = res.parent
    # Celery's worker sends the next step before it stores the head's result (children
    # included): the tail may end first. Waiting for the head reads what it stored.
    head.get(timeout=10)
    return {"head_children": ctx.outcome(lambda: [ctx.see(child) and child.id
                                                  for child in head.children or []]),
            "collect": ctx.outcome(lambda: [value for _, value in res.collect()])}


# --- eager --------------------------------------------------------------------------------------

@program
def task_always_eager_runs_canvas_inline(ctx):
    app.conf.task_always_eager = True
    try:
        return {"chain": ctx.get((add.s(1, 2) | mul.s(3)).delay()),
                "group": ctx.get(group(add.s(1, 1), add.s(2, 2)).delay()),
                "chord": ctx.get(chord([add.s(1, 1), add.s(2, 2)], tsum.s()).delay()),
                "failing_group": ctx.get(group(add.s(1, 1), fail.s("eager")).delay())}
    finally:
        app.conf.task_always_eager = False


@program
def apply_runs_canvas_inline(ctx):
    return {"chain": ctx.get(chain(add.s(1, 2), mul.s(3)).apply()),
            "group": ctx.get(group(add.s(1, 1), add.s(2, 2)).apply()),
            "chord": ctx.get(chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply()),
            "failing_chain": ctx.get(chain(add.s(1, 2), fail.s()).apply())}


# --- revokes ------------------------------------------------------------------------------------

def _chain_to_revoke(ctx):
    res = chain(add.si(1, 1), add.si(2, 2))()
    res.parent.revoke()
    return res


@program(setup=_chain_to_revoke)
def revoke_chain_head_before_worker(ctx, res):
    return {"get": ctx.get(res, timeout=4), "res": ctx.tree(res, settle=1)}


def _group_to_revoke(ctx):
    res = group(add.si(1, 1), add.si(2, 2)).delay()
    res.revoke()
    return res


@program(setup=_group_to_revoke)
def revoke_group_before_worker(ctx, res):
    return {"get": ctx.get(res, timeout=4), "shape": ctx.shape(res)}


@program
def revoke_chain_head_waiting_on_countdown(ctx):
    res = chain(add.si(1, 1).set(countdown=1.5), add.si(2, 2))()
    time.sleep(0.3)
    res.parent.revoke()
    time.sleep(2.2)
    return {"head": ctx.get(res.parent, timeout=3), "tail": ctx.get(res, timeout=1),
            "res": ctx.tree(res, settle=0.5)}


@program
def revoke_group_waiting_on_countdown(ctx):
    res = group(add.si(1, 1).set(countdown=1.5), add.si(2, 2).set(countdown=1.5)).delay()
    time.sleep(0.3)
    res.revoke()
    time.sleep(2.2)
    return {"get": ctx.get(res, timeout=3), "shape": ctx.shape(res)}


@program
def revoke_chord_header_waiting_on_countdown(ctx):
    res = chord([add.si(1, 1).set(countdown=1.5), add.si(2, 2).set(countdown=1.5)], tsum.s())()
    time.sleep(0.3)
    res.parent.revoke()
    time.sleep(2.2)
    return {"get": ctx.get(res, timeout=3), "res": ctx.tree(res, settle=1)}


# --- Task.replace ---------------------------------------------------------------------------

@program
def replace_with_a_signature(ctx):
    res = replaced_by_add.delay(2, 3)
    return {"get": ctx.get(res), "state": res.state,
            "by_id": ctx.get(app.AsyncResult(res.id))}


@program
def replace_in_a_chain_runs_the_rest_after(ctx):
    res = chain(add.s(1, 1), replaced_by_chain.s(), mul.s(2), add.s(5))()
    return {"get": ctx.get(res), "replaced": ctx.get(res.parent.parent)}


@program
def replace_with_a_group_gives_its_list(ctx):
    res = (replaced_by_group.s(3) | tsum.s())()
    return {"get": ctx.get(res), "replaced": ctx.get(res.parent)}


@program
def replace_a_chord_member(ctx):
    res = chord([add.s(1, 1), replaced_by_add.s(10, 10), add.s(3, 3)], record.s())()
    return {"get": ctx.get(res)}


@program
def replace_keeps_link_callbacks(ctx):
    path = ctx.path("calls")
    res = replaced_by_add.apply_async((20, 22), link=note.s(path=path, label="cb"))
    return {"get": ctx.get(res), "calls": ctx.lines(path, 1)}


@program
def replace_keeps_errbacks(ctx):
    path = ctx.path("errors")
    res = replaced_by_fail.apply_async(link_error=on_error_old.s(path=path))
    return {"get": ctx.get(res), "state": res.state, "errbacks": ctx.lines(path, 1)}


# --- freeze, then send --------------------------------------------------------------------------

def _ids(result):
    """The ids of a result and its parents and members (a group's), for comparing two."""
    out = {"id": result.id}
    results = getattr(result, "results", None)
    if results is not None:
        out["members"] = [member.id for member in results]
    if result.parent is not None:
        out["parent"] = _ids(result.parent)
    return out


@program
def group_freeze_keeps_ids_for_apply_async(ctx):
    sig = group(add.s(1, 1), add.s(2, 2))
    frozen = sig.freeze()
    again = sig.freeze()
    res = sig.apply_async()
    return {"same_ids": _ids(frozen) == _ids(res), "refreeze_same": _ids(again) == _ids(res),
            "get": ctx.get(res), "frozen_get": ctx.get(frozen)}


@program
def chord_freeze_keeps_header_and_body_ids(ctx):
    sig = chord([add.s(1, 1), add.s(2, 2)], tsum.s())
    frozen = sig.freeze()
    res = sig.apply_async()
    return {"body_same": frozen.id == res.id,
            "header_same": _ids(frozen.parent) == _ids(res.parent),
            "get": ctx.get(res), "frozen_get": ctx.get(frozen),
            "header_get": ctx.get(frozen.parent)}


@program
def chord_freeze_then_delay(ctx):
    sig = chord([add.s(3, 3), add.s(4, 4)], tsum.s())
    frozen = sig.freeze()
    res = sig.delay()
    return {"same_ids": _ids(frozen) == _ids(res), "get": ctx.get(frozen)}
