"""Routing cases shared by our tests and the differential run against real Celery.

Plain Python on purpose (no akadze, no pytest): the Celery interpreter imports it too.
Each case: the settings, the call, and no expected value; the reference is Celery itself.
"""

from __future__ import annotations

import re
from typing import Any


def route_math(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
               **kw: Any) -> Any:
    """Send the math tasks to "math" as a dict route."""
    if name.startswith("math."):
        return {"queue": "math"}
    return None


def route_by_kwarg(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
                   **kw: Any) -> Any:
    """Route by a keyword argument, as a plain queue name."""
    if kwargs and kwargs.get("vip"):
        return "vip"
    return None


def route_never(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
                **kw: Any) -> Any:
    """A router with no opinion."""
    return None


def route_by_first_arg(name: str, args: Any, kwargs: Any, options: Any, task: Any = None,
                       **kw: Any) -> Any:
    """Route on the first positional argument."""
    if args and args[0] == "big":
        return {"queue": "bulk", "priority": 9}
    return None


class LegacyRouter:
    """A pre-4.0 router class (route_for_task)."""

    def route_for_task(self, task: str, args: Any = None, kwargs: Any = None) -> Any:
        if task == "legacy.task":
            return {"queue": "legacy"}
        return None


def case(routes: Any, name: str, *, options: dict[str, Any] | None = None,
         args: Any = (), kwargs: Any = None, queues: list[str] | None = None,
         create_missing: bool = True, default_queue: str = "celery") -> dict[str, Any]:
    return {"routes": routes, "name": name, "options": options or {}, "args": list(args),
            "kwargs": kwargs or {}, "queues": queues, "create_missing": create_missing,
            "default_queue": default_queue}


GLOBS = {"feed.tasks.*": {"queue": "feeds"}, "web.*": "web"}
REGEX = {re.compile(r"(image|video)\.tasks\..*"): {"queue": "media"}}
ORDERED = ([("feed.*", "first"), (re.compile(r"feed\.x"), "second")],)

CASES: list[dict[str, Any]] = [
    case(None, "any.task"),
    case({"a.add": {"queue": "math"}}, "a.add"),
    case({"a.add": "math"}, "a.add"),
    case({"a.add": "math"}, "a.other"),
    case(GLOBS, "feed.tasks.import_feed"),
    case(GLOBS, "feed.tasks"),
    case(GLOBS, "feedx.tasks.import_feed"),
    case(GLOBS, "web.page.render"),
    case(REGEX, "image.tasks.resize"),
    case(REGEX, "video.tasks.encode.hd"),
    case(REGEX, "audio.tasks.encode"),
    case(REGEX, "x.image.tasks.resize"),
    case({"feed.*": "glob", "feed.x": "exact"}, "feed.x"),
    case(ORDERED, "feed.x"),
    case(ORDERED, "feed.y"),
    case(route_math, "math.add"),
    case(route_math, "text.upper"),
    case([route_never, {"x.task": "q1"}, route_math], "x.task"),
    case([route_never, {"x.task": "q1"}, route_math], "math.mul"),
    case([route_never, route_by_kwarg, {"y": "q"}], "y", kwargs={"vip": True}),
    case([route_never, route_by_kwarg, {"y": "q"}], "y", kwargs={"vip": False}),
    case(route_by_first_arg, "report", args=["big", 1]),
    case(route_by_first_arg, "report", args=["small"]),
    case("tests.compat.routing_cases:route_math", "math.add"),
    case("tests.compat.routing_cases.route_math", "math.add"),
    case(["tests.compat.routing_cases:route_never", {"z": "zq"}], "z"),
    case(LegacyRouter(), "legacy.task"),
    case(LegacyRouter(), "other.task"),
    case({"a.add": "math"}, "a.add", options={"queue": "explicit"}),
    case({"a.add": "math"}, "a.add", options={"queue": None}),
    case(route_math, "math.add", options={"queue": "explicit"}),
    case(None, "any.task", default_queue="default"),
    case({"a.add": "math"}, "b.sub", default_queue="default"),
    case({"a.add": "a"}, "a.add", queues=["a", "b"], create_missing=False),
    case({"a.add": "c"}, "a.add", queues=["a", "b"], create_missing=False),
    case(None, "a.add", queues=["a", "celery"], create_missing=False),
    case(None, "a.add", queues=["a", "b"], create_missing=False),
    case(None, "a.add", options={"queue": "other"}, create_missing=False),
    case(None, "a.add", options={"queue": "celery"}, create_missing=False),
    case(None, "a.add", options={"queue": "b"}, queues=["a", "b"], create_missing=False),
    case({"a.add": "c"}, "a.add", queues=["a", "b"], create_missing=True),
    case({"a.add": {"queue": "math", "priority": 5}}, "a.add"),
]
