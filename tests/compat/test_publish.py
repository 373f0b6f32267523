"""The publish path of ``delay()``/``apply_async``: what it caches, and that the caches change
nothing Celery code can observe (argument checks, routes, settings, signals, options)."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any
from unittest import mock

import psycopg
import pytest

import akadze_compat
from akadze_compat import Celery, Task
from akadze_compat.app.config import Settings
from akadze_compat.app.publish import PLAIN_CALL
from akadze_compat.app.task import ArgumentCheck
from akadze_compat.exceptions import QueueNotFound
from tests.compat.signal_recorder import Recorder
from tests.helpers import is_uuid4, job

# --- argument checks ---------------------------------------------------------------------


def _no_parameters() -> None: ...
def _one(a: Any) -> None: ...
def _default(a: Any, b: Any = 1) -> None: ...
def _star_args(a: Any, *args: Any) -> None: ...
def _star_kwargs(a: Any, **kw: Any) -> None: ...
def _keyword_only(a: Any, *, b: Any) -> None: ...
def _keyword_only_default(a: Any, *, b: Any = 2) -> None: ...
def _anything(*args: Any, **kwargs: Any) -> None: ...
def _positional_only(a: Any, /, b: Any) -> None: ...
def _everything(a: Any = 1, *args: Any, b: Any, c: Any = 3, **kw: Any) -> None: ...
def _two_required(a: Any, b: Any, c: Any = 0) -> None: ...


BODIES = [_no_parameters, _one, _default, _star_args, _star_kwargs, _keyword_only,
          _keyword_only_default, _anything, _positional_only, _everything, _two_required]


def _calls() -> Iterator[tuple[Any, Any]]:
    names = ["a", "b", "c", "z", "args", "kw"]
    for count in range(4):
        for size in range(3):
            for keys in itertools.combinations(names, size):
                yield list(range(count)), {key: key for key in keys}
                yield tuple(range(count)), {key: key for key in keys}
    yield "ab", {}  # a string is unpacked like any iterable by bind (and Celery's check)
    yield [], {1: "not a string key"}


def _bind_error(signature: inspect.Signature, args: Any, kwargs: Any) -> str | None:
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("body", BODIES, ids=lambda body: body.__name__)
def test_argument_check_raises_exactly_what_bind_raises(body: Callable[..., Any]) -> None:
    signature = inspect.signature(body)
    check = ArgumentCheck(body, signature)
    for args, kwargs in _calls():
        expected = _bind_error(signature, args, kwargs)
        if check.fits(args, kwargs):
            assert expected is None, (body.__name__, args, kwargs)
        try:
            check(args, kwargs)
        except TypeError as exc:
            assert str(exc) == expected, (body.__name__, args, kwargs)
        else:
            assert expected is None, (body.__name__, args, kwargs)


@pytest.fixture
def eager() -> Iterator[Celery]:
    celery = Celery("proj", set_as_current=False, task_always_eager=True)
    yield celery
    celery.close()


def test_argument_check_follows_a_replaced_body(eager: Celery) -> None:
    @eager.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add.delay(1, 2).get() == 3
    with pytest.raises(TypeError):
        add.delay(1)
    add.run = lambda x: x  # type: ignore[method-assign]
    assert add.delay(1).get() == 1
    with pytest.raises(TypeError):
        add.delay(1, 2)


def test_argument_check_of_class_based_and_bound_tasks(eager: Celery) -> None:
    class Scale(Task):
        name = "proj.scale"

        def run(self, value: int, *, factor: int = 2) -> int:
            return value * factor

    scale = eager.register_task(Scale)
    assert scale.delay(3).get() == 6 and scale.delay(3, factor=3).get() == 9
    for bad in (lambda: scale.delay(), lambda: scale.delay(1, 2),
                lambda: scale.delay(1, value=1)):
        with pytest.raises(TypeError):
            bad()

    @eager.task(bind=True)
    def bound(self: Task, x: int) -> int:
        return x

    assert bound.delay(4).get() == 4
    with pytest.raises(TypeError):
        bound.delay()


def test_argument_check_of_a_body_that_is_not_a_function(eager: Celery) -> None:
    @eager.task(name="proj.partial")
    def base(x: int, y: int) -> int:
        return x + y

    base.run = functools.partial(lambda x, y: x + y, 1)  # type: ignore[method-assign]
    assert base.delay(2).get() == 3
    with pytest.raises(TypeError):
        base.delay(2, 3)


# --- settings lookups ----------------------------------------------------------------------


def test_lookups_follow_namespace_source_and_defaults_changes() -> None:
    conf = Settings()
    assert conf.task_default_queue == "celery"
    assert conf.spellings("task_always_eager") == ["task_always_eager", "CELERY_ALWAYS_EAGER"]
    conf.set_namespace("CELERY")
    assert conf.spellings("task_always_eager")[0] == "CELERY_TASK_ALWAYS_EAGER"
    source = SimpleNamespace(CELERY_TASK_DEFAULT_QUEUE="from-source")
    conf.set_source(source)
    assert conf.task_default_queue == "from-source"
    source.CELERY_TASK_DEFAULT_QUEUE = "changed in place"  # a live source is read live
    assert conf.task_default_queue == "changed in place"
    conf.set_source({"task_routes": {"a": "b"}})
    assert conf.task_default_queue == "celery" and conf.task_routes == {"a": "b"}
    conf.add_defaults({"custom_setting": 1})
    assert conf.custom_setting == 1
    conf.task_default_queue = "changed"
    assert conf["task_default_queue"] == "changed"
    del conf["task_default_queue"]
    assert conf.task_default_queue == "celery"


def test_generation_moves_on_every_change_through_conf() -> None:
    conf = Settings()
    built: list[int] = []

    def build(settings: Settings, previous: Any) -> int:
        built.append(settings.generation())
        return len(built)

    changes: list[Callable[[], Any]] = [
        lambda: conf.__setitem__("task_routes", {}), lambda: conf.update(a=1),
        lambda: conf.__delitem__("a"), lambda: setattr(conf, "task_queues", None),
        lambda: conf.set_source({}), lambda: conf.add_defaults({}),
        lambda: conf.set_namespace("CELERY"), lambda: conf.setdefault("new_one", 1),
    ]
    assert conf.derived("key", build) == 1 and conf.derived("key", build) == 1
    for number, change in enumerate(changes, start=2):
        before = conf.generation()
        change()
        assert conf.generation() != before
        assert conf.derived("key", build) == number


# --- routing, signals, options: through the database -------------------------------------------


@pytest.fixture
def celery(database_url: str) -> Iterator[Celery]:
    app = Celery("proj", broker=database_url, set_as_current=False)
    yield app
    app.close()


def test_routes_follow_changes_made_through_conf_after_first_use(
        celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="feeds.fetch")
    def fetch() -> None: ...

    first = fetch.delay()
    celery.conf.task_routes = {"feeds.*": {"queue": "feeds", "priority": 4}}
    routed = fetch.delay()
    celery.conf.update(task_default_queue="fallback", task_routes=None)
    fallback = fetch.delay()
    del celery.conf["task_routes"]  # else the change made on the app beats the source
    celery.config_from_object({"task_routes": {"feeds.fetch": "from-source"}}, force=True)
    sourced = fetch.delay()
    rows = [job(db, result.job_id) for result in (first, routed, fallback, sourced)]
    assert [row["queue"] for row in rows] == ["celery", "feeds", "fallback", "from-source"]
    assert rows[1]["priority"] == 4
    celery.conf.update(task_routes={}, task_create_missing_queues=False,
                       task_queues=["known"])
    with pytest.raises(QueueNotFound):
        fetch.delay()
    assert job(db, fetch.apply_async(queue="known").job_id)["queue"] == "known"


def test_a_named_router_is_imported_once_per_task_routes_value(celery: Celery) -> None:
    calls: list[str] = []

    def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
              **kw: Any) -> dict[str, Any]:
        calls.append(name)
        return {"queue": "routed"}

    celery.conf.task_routes = (route,)

    @celery.task(name="proj.routed")
    def routed() -> None: ...

    routed.delay()
    celery.conf.result_expires = 60  # an unrelated change: the router is built again
    routed.delay()
    assert calls == ["proj.routed", "proj.routed"]


def test_publish_signals_and_custom_headers(celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="proj.tagged")
    def tagged(x: int) -> None: ...

    quiet = tagged.apply_async((1,), headers={"tenant": "acme", "task": "overridden"})
    meta = job(db, quiet.job_id)["meta"]["celery"]
    assert meta["headers"] == {"tenant": "acme"}  # Celery's own header names are not kept

    def add_header(headers: dict[str, Any], **kwargs: Any) -> None:
        headers["trace"] = "t-1"  # tracing libraries inject headers here

    akadze_compat.signals.before_task_publish.connect(add_header)
    try:
        traced = tagged.apply_async((2,), headers={"tenant": "acme"})
    finally:
        akadze_compat.signals.before_task_publish.disconnect(add_header)
    assert job(db, traced.job_id)["meta"]["celery"]["headers"] == {
        "tenant": "acme", "trace": "t-1"}

    recorder = Recorder("after_task_publish")
    try:
        after_only = tagged.delay(3)
    finally:
        recorder.close()
    [(_name, call)] = recorder.calls
    assert call["sender"] == "proj.tagged" and call["headers"]["id"] == after_only.id
    assert call["headers"]["argsrepr"] == "(3,)" and call["body"][0] == [3]
    assert call["routing_key"] == "celery"


class _Forwarding(Celery):
    """An app whose send_task is its own (so ``delay`` goes through it)."""

    sent: list[str]

    def send_task(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(name)
        return super().send_task(name, *args, **kwargs)


def _same_job(db: psycopg.Connection, first: Any, second: Any) -> bool:
    """Whether two jobs are alike but for their ids and for times computed a moment apart
    (a countdown or a relative expiry)."""
    rows = [job(db, result.job_id) for result in (first, second)]
    # Each call has its own task id: one chosen before the insert is kept in its job's
    # meta, any other is derived from the job id; either finds the job again.
    for row, result in zip(rows, (first, second), strict=True):
        assert row["meta"].pop("task_id", result.id) == result.id
        found = result.app.core.find_job(result.id)
        assert found is not None and found.id == result.job_id
    assert first.id != second.id
    moments: list[list[Any]] = []
    for row in rows:
        meta = row["meta"]["celery"]
        moments.append([row.pop("scheduled_at"), row.pop("expires_at"),
                        *(meta.pop(key, None) for key in ("eta", "expires"))])
        for volatile in ("id", "created_at"):
            row.pop(volatile, None)
    for ours, theirs in zip(*moments, strict=True):
        if ours is None or theirs is None:
            assert ours is theirs
            continue
        if isinstance(ours, str):
            ours, theirs = datetime.fromisoformat(ours), datetime.fromisoformat(theirs)
        assert abs(ours - theirs) < timedelta(seconds=5)
    return rows[0] == rows[1]


def test_every_option_gives_the_same_job_with_and_without_an_own_send_task(
        database_url: str, db: psycopg.Connection) -> None:
    at = datetime.now(timezone.utc).replace(second=0, microsecond=0) + timedelta(hours=1)
    calls: list[dict[str, Any]] = [
        {}, {"countdown": 600}, {"eta": at}, {"eta": at.isoformat()}, {"expires": 600},
        {"expires": at}, {"priority": 3}, {"queue": "special"}, {"headers": {"tenant": "a"}},
        {"time_limit": 30, "soft_time_limit": 20}, {"ignore_result": True},
        {"retries": 2, "chord": None, "group_id": "g", "reply_to": "r", "producer": object(),
         "exchange": "ex", "routing_key": "rk"},
    ]
    plain = Celery("proj", broker=database_url, set_as_current=False)
    forwarding = _Forwarding("proj", broker=database_url, set_as_current=False)
    forwarding.sent = []
    try:
        tasks = [app.task(name="proj.options", max_retries=5)(lambda x, y=0: None)
                 for app in (plain, forwarding)]
        for options in calls:
            results = [task.apply_async((1,), {"y": 2}, **options) for task in tasks]
            assert _same_job(db, *results), options
        assert forwarding.sent == ["proj.options"] * len(calls)
        chosen = [task.apply_async((1,), task_id=f"chosen-{index}")
                  for index, task in enumerate(tasks)]
        assert [result.id for result in chosen] == ["chosen-0", "chosen-1"]
        assert all(app.AsyncResult(result.id).exists()
                   for app, result in zip((plain, forwarding), chosen, strict=True))
    finally:
        plain.close()
        forwarding.close()


def test_a_mocked_or_wrapped_send_task_still_sees_every_call(celery: Celery) -> None:
    @celery.task(name="proj.seen")
    def seen(x: int) -> None: ...

    with mock.patch.object(Celery, "send_task", autospec=True) as patched:
        seen.delay(1)
    assert patched.call_args.args[1] == "proj.seen"
    with mock.patch.object(celery, "send_task") as on_instance:
        seen.delay(2)
    assert on_instance.call_args.args[0] == "proj.seen"

    original = Celery.send_task
    wrapped: list[str] = []

    @functools.wraps(original)
    def wrapper(self: Celery, name: str, *args: Any, **kwargs: Any) -> Any:
        wrapped.append(name)
        return original(self, name, *args, **kwargs)

    with mock.patch.object(Celery, "send_task", wrapper):
        seen.delay(3)
    assert wrapped == ["proj.seen"]
    assert seen.delay(4).exists()  # and the stock method again once unpatched
    seen.delay(5)  # a kept plain call from here on: a class patched later still sees calls
    with mock.patch.object(Celery, "send_task", autospec=True) as again:
        seen.delay(6)
    assert again.call_args.args[1] == "proj.seen"


def test_connection_and_transaction_options(celery: Celery, database_url: str,
                                            db: psycopg.Connection) -> None:
    @celery.task(name="proj.in_tx")
    def in_tx() -> None: ...

    with psycopg.connect(database_url) as connection:
        kept = in_tx.apply_async(connection=connection)
        with akadze_compat.transaction(connection):
            also = in_tx.delay()
        assert not celery.AsyncResult(kept.id).exists()  # not committed yet
        connection.rollback()
        with akadze_compat.transaction(connection):
            committed = in_tx.delay()
    assert [celery.AsyncResult(result.id).exists() for result in (kept, also, committed)] \
        == [False, False, True]
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (1,)


# --- plain calls: the configured core call kept per task ---------------------------------------


def test_plain_calls_follow_changes_to_the_task_and_the_settings(
        celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="proj.plain", max_retries=2)
    def plain(x: int) -> None: ...

    def row() -> dict[str, Any]:
        result = plain.delay(1)
        found = job(db, result.job_id)
        # No task id is stored: the job is known by the one derived from its job id.
        assert "task_id" not in found["meta"] and is_uuid4(result.id)
        assert celery.core.task_ids().job_id(result.id) == result.job_id
        return found

    first, again = row(), row()
    # The second call reused the kept core call: the stock send_task is recognized on every
    # Python (3.10's code objects have no co_qualname).
    assert PLAIN_CALL in plain.__dict__
    assert (first["queue"], first["priority"], first["max_attempts"]) == ("celery", 0, 3)
    assert {key: again[key] for key in ("queue", "priority", "max_attempts", "meta")} == {
        key: first[key] for key in ("queue", "priority", "max_attempts", "meta")}
    plain.max_retries = 7
    assert row()["max_attempts"] == 8
    plain.queue, plain.priority = "other", 5
    changed = row()
    assert (changed["queue"], changed["priority"], changed["max_attempts"]) == ("other", 5, 8)
    plain.time_limit, plain.ignore_result = 30, True
    assert row()["meta"]["celery"]["time_limit"] == 30
    assert plain.delay(1).ignored
    plain.queue = None
    celery.conf.task_default_queue = "renamed"
    assert row()["queue"] == "renamed"
    plain.expires = 60  # relative to each call
    expiring = [row()["expires_at"] for _ in range(2)]
    assert expiring[0] is not None and expiring[1] > expiring[0]


def test_a_kept_plain_calls_result_is_the_one_the_full_path_makes(
        celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="proj.kept_result")
    def kept_result(x: int) -> None: ...

    def shape(result: Any) -> dict[str, Any]:
        return {key: value for key, value in vars(result).items() if key not in ("_id",
                                                                                "_job_id")}

    full = kept_result.delay(1)  # the full path, which keeps the call
    assert akadze_compat.app.publish.PLAIN_CALL in kept_result.__dict__
    kept = kept_result.delay(2)
    assert type(kept) is type(full) and shape(kept) == shape(full)
    assert kept.ignored is False and kept.parent is None and kept.backend is celery.backend
    assert is_uuid4(kept.id) and celery.core.task_ids().job_id(kept.id) == kept.job_id
    assert job(db, kept.job_id)["args"] == {"args": [2], "kwargs": {}}
    # ignore_result: the task's own, else task_ignore_result, read at each kept call.
    celery.conf.task_ignore_result = True
    assert kept_result.delay(3).ignored is True
    kept_result.ignore_result = False
    assert kept_result.delay(4).ignored is False


def test_of_job_makes_what_the_constructor_does(celery: Celery) -> None:
    from akadze_compat.result import AsyncResult

    made = AsyncResult("", app=celery, task_name="proj.t", job_id=42)
    made.id = None  # type: ignore[assignment]
    made.ignored = True
    quick = AsyncResult.of_job(celery, "proj.t", 42, ignored=True)
    assert vars(quick) == vars(made) and quick.id == made.id


def test_plain_calls_and_a_router_function_see_each_call(celery: Celery,
                                                         db: psycopg.Connection) -> None:
    def by_argument(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
                    **kw: Any) -> dict[str, Any]:
        return {"queue": f"shard-{args[0] % 2}"}

    celery.conf.task_routes = (by_argument,)

    @celery.task(name="proj.sharded")
    def sharded(n: int) -> None: ...

    assert [job(db, sharded.delay(n).job_id)["queue"] for n in range(4)] == [
        "shard-0", "shard-1", "shard-0", "shard-1"]


def test_plain_calls_in_a_transaction_and_with_receivers(
        celery: Celery, database_url: str, db: psycopg.Connection) -> None:
    @celery.task(name="proj.joined")
    def joined() -> None: ...

    before = joined.delay()  # a plain call through the pool: kept for the next ones
    with psycopg.connect(database_url) as connection, pytest.raises(RuntimeError), \
            akadze_compat.transaction(connection):
        inside = joined.delay()
        raise RuntimeError("roll back")
    assert before.exists() and not inside.exists()
    recorder = Recorder("before_task_publish", "after_task_publish")
    try:
        sent = joined.delay()
    finally:
        recorder.close()
    assert recorder.names() == ["before_task_publish", "after_task_publish"]
    assert recorder.calls[1][1]["headers"]["id"] == sent.id
    assert joined.delay().exists()


async def test_a_plain_call_inside_a_task_gets_its_parent(celery: Celery) -> None:
    from akadze_core import Worker
    from tests.helpers import run_worker_until

    seen: dict[str, Any] = {}

    @celery.task(bind=True, name="proj.child")
    def child(self: Task) -> None:
        seen[self.request.id] = (self.request.parent_id, self.request.root_id)

    @celery.task(name="proj.parent", bind=True)
    def parent(self: Task) -> str:
        return str(child.delay().id)

    worker = Worker(celery.prepare_worker(), queues=["celery"], slots=2, poll_interval=0.05)
    outside = child.delay()  # kept as a plain call: no parent
    result = parent.delay()

    def done() -> bool:
        return result.ready() and len(seen) == 2

    assert await run_worker_until(worker, done) == 0
    assert seen[outside.id] == (None, outside.id)
    assert seen[result.get()] == (result.id, result.id)


def test_kept_plain_calls_still_check_arguments_and_read_eager_live(
        celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="proj.checked")
    def checked(x: int) -> int:
        return x * 2

    checked.delay(1)  # kept from here on
    with pytest.raises(TypeError):
        checked.delay(1, 2)
    with pytest.raises(TypeError):
        checked.apply_async((), {"y": 1})
    celery.conf.task_always_eager = True
    assert checked.delay(4).get() == 8
    celery.conf.task_always_eager = False
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (1,)


def test_kept_plain_calls_go_through_an_overridden_apply_async_and_shadow_name(
        celery: Celery, db: psycopg.Connection) -> None:
    sent: list[Any] = []

    class Counting(Task):
        def apply_async(self, *args: Any, **kwargs: Any) -> Any:
            sent.append(args)
            return super().apply_async(*args, **kwargs)

    class Shadowed(Task):
        def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str | None:
            return f"shadow-{args[0]}" if args and args[0] else None

    @celery.task(name="proj.counted", base=Counting)
    def counted() -> None: ...

    @celery.task(name="proj.shadowed", base=Shadowed)
    def shadowed(n: int) -> None: ...

    @celery.task(name="proj.mocked")
    def mocked() -> None: ...

    for _ in range(3):
        counted.delay()
    assert len(sent) == 3
    shadows = [job(db, shadowed.delay(n).job_id)["meta"]["celery"].get("shadow")
               for n in (0, 0, 1, 0)]
    assert shadows == [None, None, "shadow-1", None]
    mocked.delay()  # kept: the mock on the instance must still be what delay() calls
    with mock.patch.object(mocked, "apply_async") as patched:
        mocked.delay(5)
    patched.assert_called_once_with((5,), {})
    with mock.patch.object(type(mocked), "apply_async") as on_class:
        mocked.delay(6)
    on_class.assert_called_once_with((6,), {})
    assert counted.delay().exists() and len(sent) == 4  # an override, kept: still called


def test_a_task_id_is_stored_only_when_something_saw_it_before_the_insert(
        celery: Celery, db: psycopg.Connection) -> None:
    """A send nobody saw the id of before the insert stores none (its row and the task id
    index stay as small as a plain job's): the result's id is derived from the job id, a
    uuid4 string as Celery's, and resolves from anywhere. A chosen id, an id the publish
    signals' receivers saw, and a linked call's id are kept in the meta."""
    @celery.task(name="proj.ids")
    def ids(x: int = 0) -> None: ...

    def stored(result: Any) -> Any:
        return job(db, result.job_id)["meta"].get("task_id")

    plain, full, sent = ids.delay(1), ids.apply_async((2,), countdown=1), \
        celery.send_task("proj.ids", (3,))
    for result in (plain, full, sent):
        assert stored(result) is None and is_uuid4(result.id)
        again = celery.AsyncResult(result.id)
        assert again.state == "PENDING" and again._job() is not None
        assert again._job().id == result.job_id
    assert len({plain.id, full.id, sent.id}) == 3
    chosen = ids.apply_async((4,), task_id="chosen-id")
    assert chosen.id == "chosen-id" and stored(chosen) == "chosen-id"
    linked = ids.apply_async((5,), link=ids.si(6))
    assert stored(linked) == linked.id
    seen: list[str] = []

    def receiver(headers: Any = None, **_: Any) -> None:
        seen.append(headers["id"])

    akadze_compat.signals.before_task_publish.connect(receiver)
    try:
        heard = ids.delay(7)
    finally:
        akadze_compat.signals.before_task_publish.disconnect(receiver)
    assert seen == [heard.id] and stored(heard) == heard.id and is_uuid4(heard.id)


def test_repeated_plain_calls_equal_the_full_path(database_url: str,
                                                  db: psycopg.Connection) -> None:
    plain = Celery("proj", broker=database_url, set_as_current=False)
    forwarding = _Forwarding("proj", broker=database_url, set_as_current=False)
    forwarding.sent = []
    try:
        plain.conf.task_routes = {"proj.*": {"queue": "routed", "priority": 2}}
        forwarding.conf.task_routes = {"proj.*": {"queue": "routed", "priority": 2}}
        tasks = [app.task(name="proj.same", max_retries=1, time_limit=9)(lambda x=0: None)
                 for app in (plain, forwarding)]
        for n in range(3):
            assert _same_job(db, *(task.delay(n) for task in tasks)), n
    finally:
        plain.close()
        forwarding.close()


def _deep_list(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def test_names_and_args_past_the_limits_raise_encode_error_and_insert_nothing(
        celery: Celery, db: psycopg.Connection) -> None:
    """Deep args, and queue names, task names and task ids over 255 characters (or with a
    NUL) raise kombu's EncodeError, as other bad arguments do, before anything is inserted:
    every step of a canvas is checked before any is."""
    from kombu.exceptions import EncodeError

    from akadze_compat import chain, chord, group

    @celery.task(name="proj.add")
    def add(x: Any, y: Any) -> Any:
        return x + y

    deep, long = _deep_list(10_000), "q" * 8200
    attempts: dict[str, Callable[[], Any]] = {
        "delay deep": lambda: add.delay(deep, 1),
        "queue of 8 KB": lambda: add.apply_async((1, 2), queue=long),
        "queue with a NUL": lambda: add.apply_async((1, 2), queue="q\x00"),
        "task id too long": lambda: add.apply_async((1, 2), task_id="i" * 256),
        "task name too long": lambda: celery.send_task("n" * 256, (1,)),
        "chain step": lambda: chain(add.s(1, 2), add.s(3).set(queue=long)).apply_async(),
        "group member": lambda: group(add.s(1, 2), add.s(3, 4).set(queue=long)).apply_async(),
        "chord body": lambda: chord([add.s(1, 2)], add.s(3).set(queue=long)).apply_async(),
        "chain deep args": lambda: chain(add.s(1, 2), add.s(deep)).apply_async(),
    }
    for name, attempt in attempts.items():
        with pytest.raises(EncodeError, match=r"limit of 255|NUL|nested too deeply"):
            attempt()
        assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,), name
    add.apply_async((1, 2), queue="q" * 255, task_id="i" * 255)  # at the limit: fine
    assert db.execute("SELECT queue FROM akadze.jobs").fetchone() == ("q" * 255,)
