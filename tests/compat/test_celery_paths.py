"""Celery's module paths import after the rename; a name akadze_compat leaves out says so at
the import and names the migration guide's section; AbortableTask runs on the cancel flag."""

from __future__ import annotations

import importlib
import re
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import akadze_compat
from akadze_compat import Celery, states
from akadze_compat.contrib.abortable import AbortableAsyncResult, AbortableTask
from akadze_compat.doctor_scan import exists_in_facade
from akadze_compat.utils import time as celery_time
from akadze_compat.utils.unsupported import GUIDE, NotProvided
from tests.compat.conftest import work

#: The deep imports real projects use, as a Celery project writes them after the rename.
WORKING = [
    ("akadze_compat.app.task", ("Task", "Context")),
    ("akadze_compat._state", ("current_app", "get_current_task", "get_current_worker_task",
                              "connect_on_app_finalize", "set_default_app")),
    ("akadze_compat.app.control", ("Control", "Inspect", "flatten_reply")),
    ("akadze_compat.app.registry", ("TaskRegistry",)),
    ("akadze_compat.app.routes", ("MapRoute", "Router")),
    ("akadze_compat.app.trace", ("ExceptionInfo", "TraceInfo", "build_tracer", "task_has_custom",
                                 "trace_ok_t")),
    ("akadze_compat.utils.time", ("maybe_timedelta", "is_naive", "make_aware", "localize",
                                  "to_utc", "maybe_make_aware", "maybe_iso8601",
                                  "get_exponential_backoff_interval", "humanize_seconds")),
    ("akadze_compat.utils.threads", ("Local", "get_ident")),
    ("akadze_compat.contrib.abortable", ("AbortableTask", "AbortableAsyncResult", "ABORTED")),
    ("akadze_compat.contrib.django.task", ("DjangoTask",)),
    ("akadze_compat.beat", ("Scheduler", "ScheduleEntry", "SchedulingError",
                            "DEFAULT_MAX_INTERVAL")),
    ("akadze_compat.platforms", ("close_open_fds",)),
    ("akadze_compat.registry", ("tasks",)),
    ("akadze_compat.app", ("app_or_default",)),
    ("akadze_compat.backends.base", ("BaseBackend", "BaseDictBackend", "Backend",
                                     "KeyValueStoreBackend", "DisabledBackend",
                                     "get_current_task")),
    ("akadze_compat.worker.control", ("Panel", "control_command", "inspect_command")),
    ("akadze_compat.worker.request", ("Request",)),
    ("akadze_compat.bootsteps", ("Step", "StartStopStep", "Blueprint", "ConsumerStep")),
]
#: Names left out on purpose: importing one raises NotProvided naming a guide section.
REFUSED = [
    ("akadze_compat.beat", "PersistentScheduler"), ("akadze_compat.beat", "Service"),
    ("akadze_compat.app.trace", "trace_task"),
    ("akadze_compat.worker.request", "create_request_cls"),
    ("akadze_compat.canvas", "StampingVisitor"),
    ("akadze_compat.utils.threads", "bgThread"),
    ("akadze_compat.utils.time", "delta_resolution"),
]
GUIDE_TEXT = (Path(akadze_compat.__file__).parent.parent / GUIDE).read_text("utf-8")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE):
        text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
        found.add(text.replace(" ", "-"))
    return found


@pytest.mark.parametrize(("module", "names"), WORKING)
def test_celery_paths_import(module: str, names: tuple[str, ...]) -> None:
    imported = importlib.import_module(module)
    for name in names:
        assert getattr(imported, name) is not None


@pytest.mark.parametrize(("module", "name"), REFUSED)
def test_left_out_names_fail_at_the_import_naming_the_guide_section(module: str,
                                                                    name: str) -> None:
    with pytest.raises(NotProvided) as raised:
        exec(f"from {module} import {name}", {})
    message = str(raised.value)
    assert f"{module}.{name}" in message
    section = re.search(rf"{re.escape(GUIDE)}#([\w-]+)", message)
    assert section is not None, message
    assert section.group(1) in anchors(GUIDE_TEXT)
    # The doctor counts it as missing, and an unknown name is still an AttributeError.
    assert not exists_in_facade("celery" + module.removeprefix("akadze_compat") + "." + name)
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), "no_such_name")  # noqa: B009


def test_time_helpers_behave_as_celerys() -> None:
    naive = datetime(2026, 3, 1, 12, 0)
    paris = ZoneInfo("Europe/Paris")
    assert celery_time.maybe_timedelta(30) == timedelta(seconds=30)
    assert celery_time.is_naive(naive) and not celery_time.is_naive(naive.replace(
        tzinfo=timezone.utc))
    assert celery_time.make_aware(naive, paris).utcoffset() == timedelta(hours=1)
    assert celery_time.to_utc(naive) == naive.replace(tzinfo=timezone.utc)
    assert celery_time.maybe_make_aware(naive, paris).hour == 13
    assert celery_time.maybe_iso8601("2026-03-01T12:00:00+00:00") == \
        naive.replace(tzinfo=timezone.utc)
    assert celery_time.get_exponential_backoff_interval(2, 3, 10) == 10
    assert celery_time.get_exponential_backoff_interval(2, 2, 10) == 8
    assert 0 <= celery_time.get_exponential_backoff_interval(2, 2, 10, full_jitter=True) <= 8


async def test_abort_keeps_a_queued_task_from_running(celery: Celery) -> None:
    @celery.task(base=AbortableTask)
    def export() -> None:
        raise AssertionError("aborted before it ran")

    result = export.apply_async(countdown=3600)
    assert isinstance(result, AbortableAsyncResult)
    assert not result.is_aborted()
    result.abort()
    assert result.is_aborted()
    assert result.state == states.REVOKED


async def test_a_running_task_sees_is_aborted(celery: Celery) -> None:
    started, aborted = threading.Event(), threading.Event()

    @celery.task(bind=True, base=AbortableTask)
    def export(self: AbortableTask) -> str:
        started.set()
        aborted.wait(10)
        return "stopped early" if self.is_aborted() else "ran to the end"

    result = export.delay()

    def abort_when_started() -> bool:
        if started.is_set() and not aborted.is_set():
            result.abort()
            aborted.set()
        return result.ready()

    await work(celery, abort_when_started)
    assert result.get(timeout=5) == "stopped early"
