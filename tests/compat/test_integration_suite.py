"""What Celery's own integration suite asks of a worker, on akadze: ``inspect()``'s clock,
report, conf, stats and scheduled as its ``t/integration/test_inspect.py`` checks them, the
``Manager`` of ``celery.contrib.testing.manager`` its conftest builds, and the worker named
``anon_nodename()`` as its tests look it up. Shapes were read from a Celery 5.7 worker on
Redis (the suite's own assertions, kept here)."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from akadze_compat import Celery, states
from akadze_compat.contrib.testing.app import TestApp, setup_default_app
from akadze_compat.contrib.testing.manager import Manager, Sentinel
from akadze_compat.contrib.testing.worker import start_worker
from akadze_compat.utils.nodenames import anon_nodename

NODENAME = anon_nodename()


@pytest.fixture
def suite(database_url: str) -> Iterator[tuple[Celery, Any]]:
    """Celery's integration conftest, in short: a test app with a result backend named,
    ``result_extended``, and an embedded solo worker."""
    app = TestApp("t.integration", config={"broker_url": database_url,
                                           "result_backend": "redis://localhost/1",
                                           "result_extended": True})
    release = threading.Event()

    @app.task(name="t.integration.tasks.add")
    def add(x: int, y: int, z: int | None = None) -> int:
        return x + y + (z or 0)

    @app.task(name="t.integration.tasks.sleeping")
    def sleeping(seconds: float) -> None:
        release.wait(seconds)

    app.release = release  # type: ignore[attr-defined]
    with setup_default_app(app), start_worker(app, pool="solo", shutdown_timeout=5) as worker:
        yield app, worker
        release.set()
    app.close()


def test_the_embedded_worker_answers_under_anon_nodename(suite: tuple[Celery, Any]) -> None:
    app, worker = suite
    assert worker.hostname == NODENAME == f"gen{os.getpid()}@{os.uname().nodename}"
    assert app.control.inspect(timeout=3).ping() == {NODENAME: {"ok": "pong"}}


def test_clock_report_conf_and_stats_as_the_suite_checks_them(
        suite: tuple[Celery, Any]) -> None:
    app, _ = suite
    inspect = app.control.inspect(timeout=3)
    clock = inspect.clock()
    assert list(clock) == [NODENAME] and clock[NODENAME]["clock"] > 0
    assert inspect.clock()[NODENAME]["clock"] > clock[NODENAME]["clock"]

    report = inspect.report()
    assert list(report) == [NODENAME] and list(report[NODENAME]) == ["ok"]
    assert "software -> celery:" in report[NODENAME]["ok"]
    assert report[NODENAME]["ok"] == app.bugreport()

    conf = inspect.conf()[NODENAME]
    for key in ("worker_hijack_root_logger", "worker_log_color", "accept_content",
                "enable_utc", "timezone", "broker_url", "result_backend", "broker_heartbeat",
                "deprecated_settings", "include"):
        assert key in conf, key
    assert conf["worker_hijack_root_logger"] is False
    assert conf["accept_content"] == "{'json'}"  # a set, by its repr as Celery's jsonify
    assert conf["deprecated_settings"] is None
    assert "t.integration" not in conf["include"]
    assert "akadze_compat.contrib.testing.tasks" in conf["include"]

    stats = inspect.stats()[NODENAME]
    assert stats["pool"]["max-concurrency"] == 1
    assert len(stats["pool"]["processes"]) == 1
    assert stats["pid"] == os.getpid()  # the worker is a thread of this process


def test_scheduled_entry_shape(suite: tuple[Celery, Any]) -> None:
    app, _ = suite
    exec_time = datetime.now(UTC) + timedelta(seconds=30)
    result = app.tasks["t.integration.tasks.add"].apply_async([1, 2], {"z": 3}, eta=exec_time)
    ret = app.control.inspect(timeout=3).scheduled()
    assert ret[NODENAME] == [{
        "eta": exec_time.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+00:00",
        "priority": 6,
        "request": {
            "id": result.id, "name": "t.integration.tasks.add", "args": [1, 2],
            "kwargs": {"z": 3}, "type": "t.integration.tasks.add",
            "hostname": NODENAME, "time_start": None, "acknowledged": False,
            "delivery_info": {"exchange": "", "routing_key": "celery", "priority": 0,
                              "redelivered": False},
            "worker_pid": None,
        },
    }]
    result.revoke()


def test_manager_joins_waits_and_sees_tasks_accepted(suite: tuple[Celery, Any]) -> None:
    app, _ = suite
    out = io.StringIO()
    manager = Manager(app, stdout=out, stderr=out)
    add = app.tasks["t.integration.tasks.add"]
    # join() waits; with its callback the values are not collected (Celery's ResultSet).
    first = add.delay(2, 2)
    assert manager.join(first, timeout=10) == []
    assert first.ready() and first.result == 4

    sleeping = app.tasks["t.integration.tasks.sleeping"].delay(20)
    assert manager.assert_accepted([sleeping.id], max_retries=40) is True
    assert manager.query_task_states([sleeping.id])["active"] == {sleeping.id}
    assert manager.is_received([sleeping.id])
    assert manager.assert_result_tasks_in_progress_or_completed(
        [add.delay(3, 3)], max_retries=40) is True

    attempts = []

    def third_time() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise Sentinel()
        return "done"

    assert manager.wait_for(third_time, (Sentinel,), interval_start=0.01) == "done"
    with pytest.raises(AssertionError, match="Should not have happened: it"):
        manager.ensure_not_for_a_while(lambda: "at once", (Sentinel,), desc="it")
    manager.ensure_not_for_a_while(lambda: (_ for _ in ()).throw(Sentinel()), (Sentinel,),
                                   max_retries=3)

    app.release.set()  # type: ignore[attr-defined]
    assert sleeping.get(timeout=10) is None
    manager.wait_until_idle()
    assert app.control.inspect(timeout=3).active() == {NODENAME: []}
    assert add.delay(5, 5).state in (states.PENDING, states.SUCCESS)


def test_join_gives_up_after_its_retries(suite: tuple[Celery, Any]) -> None:
    app, _ = suite
    out = io.StringIO()
    manager = Manager(app, stdout=out, stderr=out)
    never = app.tasks["t.integration.tasks.sleeping"].delay(30)
    with pytest.raises(AssertionError, match="Missing task results"):
        manager.join(never, max_retries=2, timeout=0.2)
    assert out.getvalue().count("!Still waiting for 1/1") == 2
    assert never.id in out.getvalue()
    app.release.set()  # type: ignore[attr-defined]
