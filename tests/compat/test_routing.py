"""task_routes resolution: unit tests and a differential run against Celery's router."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kombu import Queue

from akadze_compat.app.routes import MapRoute, Router, prepare, queue_names
from akadze_compat.exceptions import QueueNotFound
from tests.compat import routing_cases
from tests.compat.celery_reference import run_celery


def route(routes: Any, name: str, options: dict[str, Any] | None = None,
          **settings: Any) -> dict[str, Any]:
    router = Router(prepare(routes), queue_names(settings.get("queues")),
                    settings.get("default_queue", "celery"),
                    settings.get("create_missing", True))
    return router.route(options or {}, name, settings.get("args", ()),
                        settings.get("kwargs"))


def test_no_routes_goes_to_the_default_queue() -> None:
    assert route(None, "proj.tasks.add") == {"queue": "celery"}
    assert route({}, "proj.tasks.add", default_queue="default")["queue"] == "default"


def test_exact_glob_and_regex_routes() -> None:
    routes = {"a.add": "math", "feed.tasks.*": {"queue": "feeds"},
              re.compile(r"(image|video)\."): {"queue": "media", "priority": 3}}
    assert route(routes, "a.add")["queue"] == "math"
    assert route(routes, "feed.tasks.fetch")["queue"] == "feeds"
    assert route(routes, "feedx.tasks.fetch")["queue"] == "celery"
    assert route(routes, "video.encode") == {"queue": "media", "priority": 3}


def test_exact_names_win_over_patterns() -> None:
    assert route({"feed.*": "glob", "feed.x": "exact"}, "feed.x")["queue"] == "exact"


def test_list_of_routers_first_answer_wins() -> None:
    calls: list[str] = []

    def silent(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
               **kw: Any) -> None:
        calls.append(name)

    routes = [silent, {"x": "first"}, lambda *a, **k: "second"]
    assert route(routes, "x")["queue"] == "first"
    assert route(routes, "y")["queue"] == "second"
    assert calls == ["x", "y"]


def test_router_by_import_path() -> None:
    for path in ("tests.compat.routing_cases:route_math", "tests.compat.routing_cases.route_math"):
        assert route(path, "math.add")["queue"] == "math"
        assert route(path, "text.upper")["queue"] == "celery"


def test_router_sees_args_and_kwargs() -> None:
    assert route(routing_cases.route_by_kwarg, "t", kwargs={"vip": True})["queue"] == "vip"
    assert route(routing_cases.route_by_first_arg, "t", args=["big"]) == {
        "queue": "bulk", "priority": 9}


def test_explicit_queue_wins_and_options_override_the_route() -> None:
    routes = {"a": {"queue": "math", "priority": 5}}
    assert route(routes, "a", {"queue": "explicit"})["queue"] == "explicit"
    assert route(routes, "a", {"queue": None, "priority": 1}) == {"queue": "math", "priority": 1}


def test_missing_queues() -> None:
    queues = [Queue("a"), Queue("b")]
    assert route({"t": "a"}, "t", queues=queues, create_missing=False)["queue"] == "a"
    with pytest.raises(QueueNotFound):
        route({"t": "c"}, "t", queues=queues, create_missing=False)
    with pytest.raises(QueueNotFound):  # the default queue is not declared either
        route(None, "t", queues=queues, create_missing=False)
    assert route(None, "t", create_missing=False)["queue"] == "celery"
    assert route({"t": "c"}, "t", queues=queues)["queue"] == "c"


def test_queue_names_accepts_kombu_queues_names_and_dicts() -> None:
    assert queue_names([Queue("a"), "b"]) == ["a", "b"]
    assert queue_names({"x": {"exchange": "x"}}) == ["x"]
    assert queue_names(None) == []


def test_kombu_queue_as_route_value() -> None:
    assert route({"t": Queue("special")}, "t", create_missing=False)["queue"] == "special"


def test_map_route_accepts_pairs() -> None:
    router = MapRoute([("a.*", "first"), (re.compile("a"), "second")])
    assert router("a.b") == {"queue": "first"}
    assert router("ab") == {"queue": "second"}
    assert router("b") is None


def ours(case: dict[str, Any]) -> str:
    try:
        return route(case["routes"], case["name"], dict(case["options"]),
                     args=case["args"], kwargs=case["kwargs"], queues=case["queues"],
                     create_missing=case["create_missing"],
                     default_queue=case["default_queue"])["queue"]
    except QueueNotFound:
        return "QueueNotFound"


CELERY_SCRIPT = """
import json
from kombu import Queue
from celery import Celery
from celery.exceptions import QueueNotFound
from tests.compat.routing_cases import CASES

results = []
for case in CASES:
    app = Celery(set_as_current=False, broker="memory://")
    app.conf.task_routes = case["routes"]
    app.conf.task_default_queue = case["default_queue"]
    app.conf.task_create_missing_queues = case["create_missing"]
    if case["queues"]:
        app.conf.task_queues = [Queue(name) for name in case["queues"]]
    try:
        options = app.amqp.router.route(dict(case["options"]), case["name"], case["args"],
                                        case["kwargs"])
        queue = options.get("queue")
        results.append(queue if isinstance(queue, str) else queue.name)
    except QueueNotFound:
        results.append("QueueNotFound")
print(json.dumps(results))
"""


def test_same_routing_decisions_as_celery() -> None:
    expected = run_celery(CELERY_SCRIPT)
    cases = routing_cases.CASES
    assert len(expected) == len(cases)
    mismatches = [(case["name"], case["routes"], celery, ours(case))
                  for case, celery in zip(cases, expected, strict=True) if ours(case) != celery]
    assert not mismatches
