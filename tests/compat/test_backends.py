"""``celery.backends.base``'s classes, ``celery.app.backends``' selection, and ``get()`` on a
ready result with a timeout that is not a number."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_compat import Celery, states
from akadze_compat.app.backends import BACKEND_ALIASES, by_name, by_url
from akadze_compat.backends.base import (
    BaseBackend,
    BaseDictBackend,
    DisabledBackend,
    KeyValueStoreBackend,
)
from akadze_compat.backends.database import DatabaseBackend
from akadze_compat.exceptions import ImproperlyConfigured, TimeoutError
from akadze_compat.result import EagerResult
from tests.compat.conftest import work
from tests.compat.differential import celery_python, no_celery_reason


class DictBackend(KeyValueStoreBackend):
    """A project's key-value backend: a dict for its store."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store: dict[str, str] = {}

    def get(self, key: str) -> Any:
        return self.store.get(key)

    def set(self, key: str, value: Any) -> None:
        self.store[key] = value

    def delete(self, key: str) -> None:
        self.store.pop(key, None)


def test_a_key_value_subclass_stores_and_reads_as_celerys_does() -> None:
    backend = DictBackend(app=None, url="dict://")
    assert backend.get_state("t1") == states.PENDING
    backend.mark_as_done("t1", {"n": 1})
    backend.mark_as_failure("t2", ValueError("bad", 2))
    assert list(backend.store) == ["celery-task-meta-t1", "celery-task-meta-t2"]
    assert backend.get_state("t1") == states.SUCCESS
    assert backend.get_result("t1") == {"n": 1}
    assert backend.get_result("t2") == {"exc_type": "ValueError", "exc_message": ["bad", 2],
                                        "exc_module": "builtins"}
    backend.forget("t1")
    assert backend.get_state("t1") == states.PENDING
    assert isinstance(backend, BaseBackend) is False  # as in Celery: a sibling class
    assert BaseDictBackend is BaseBackend


def test_the_disabled_backend_stores_nothing_and_refuses_reads() -> None:
    backend = DisabledBackend(app=None)
    assert backend.store_result("t", 1, states.SUCCESS) is None
    with pytest.raises(NotImplementedError, match="No result backend"):
        backend.get_state("t")
    # celery-progress's KnownResult reads the state sets from the class itself.
    assert DisabledBackend.READY_STATES == states.READY_STATES
    assert states.SUCCESS in DisabledBackend.READY_STATES
    assert states.PENDING in DisabledBackend.UNREADY_STATES


def test_backend_names_resolve_as_celerys() -> None:
    assert by_name("redis") is DatabaseBackend  # results stay in the job rows
    assert by_name(None) is by_name("disabled") is DisabledBackend
    assert by_url("redis://localhost:6379/1") == (DatabaseBackend, "redis://localhost:6379/1")
    assert by_url("db+postgresql://h/d") == (DatabaseBackend, "postgresql://h/d")
    assert by_name("tests.compat.test_backends:DictBackend") is DictBackend
    assert by_name("tests.compat.test_backends.DictBackend") is DictBackend

    class Loader:
        def __init__(self) -> None:
            self.override_backends = {"mine": "tests.compat.test_backends:DictBackend"}

    assert by_name("mine", Loader()) is DictBackend
    with pytest.raises(ImproperlyConfigured, match="Unknown result backend: 'nosuch'"):
        by_name("nosuch")
    with pytest.raises(ImproperlyConfigured, match="is a Python module"):
        by_name("tests.compat:test_backends")
    assert set(BACKEND_ALIASES) >= {"redis", "rpc", "db", "database", "cache", "disabled"}


def test_by_name_finds_the_names_packages_register() -> None:
    """django_celery_results registers ``django-db`` as a ``celery.result_backends`` entry
    point; Celery (and this) resolve it through the entry point."""
    pytest.importorskip("django_celery_results")
    points = {point.name: point.value for point in entry_points(group="celery.result_backends")}
    assert points.get("django-db") == "django_celery_results.backends:DatabaseBackend"


async def test_get_on_a_ready_result_ignores_a_timeout_that_is_not_a_number(
        celery: Celery, db: psycopg.Connection) -> None:
    """celery-progress calls ``result.get(result.id)``: the task id lands in ``timeout``;
    on a ready result Celery never reads it."""

    @celery.task(name="backends.add")
    def add(x: int, y: int) -> int:
        return x + y

    result = add.delay(2, 3)
    await work(celery, result.ready)
    fresh = celery.AsyncResult(result.id)
    assert fresh.get(fresh.id) == 5  # type: ignore[arg-type]
    assert EagerResult("e", 7, states.SUCCESS).get("not a number") == 7  # type: ignore[arg-type]
    pending = add.delay(1, 1)
    with pytest.raises(TimeoutError):
        pending.get(timeout=0.2)
    with pytest.raises(TypeError):
        pending.get(pending.id)  # type: ignore[arg-type]  # not ready: read, as in Celery


async def test_progress_state_reads_through_get_task_meta(
        celery: Celery, db: psycopg.Connection) -> None:
    """celery-progress's ``Progress.get_info()`` reads ``_get_task_meta()``'s ``status`` and
    ``result`` while the task stores ``PROGRESS`` with ``update_state``."""
    seen: dict[str, Any] = {}
    release = threading.Event()

    @celery.task(bind=True, name="backends.progress")
    def slow(self: Any) -> str:
        self.update_state(state="PROGRESS", meta={"current": 1, "total": 4})
        release.wait(10)
        return "done"

    result = slow.delay()

    def progressed() -> bool:
        meta = celery.AsyncResult(result.id)._get_task_meta()
        if meta["status"] == "PROGRESS" and "progress" not in seen:
            seen["progress"] = (meta["status"], meta["result"])
            release.set()
        return result.ready()

    await work(celery, progressed)
    assert seen["progress"] == ("PROGRESS", {"current": 1, "total": 4})
    final = celery.AsyncResult(result.id)._get_task_meta()
    assert (final["status"], final["result"]) == (states.SUCCESS, "done")


def test_an_eager_result_without_an_id_and_one_that_keeps_its_backend() -> None:
    """celery-once answers a refused call with ``EagerResult(None, None, REJECTED)``;
    celery-progress's ``KnownResult`` sets ``backend = DisabledBackend`` before
    ``EagerResult.__init__`` and reads the ready states from it."""
    refused = EagerResult(None, None, states.REJECTED)  # type: ignore[arg-type]
    assert (refused.id, refused.state) == (None, states.REJECTED)

    class KnownResult(EagerResult):
        def __init__(self, id: str, ret_value: Any, state: str) -> None:
            self.backend = DisabledBackend
            super().__init__(id, ret_value, state)

    known = KnownResult("k", {"current": 1}, "PROGRESS")
    assert known.backend is DisabledBackend
    assert known.state == "PROGRESS" and known.id == "k"


_NAMES_PROBE = """
import json
from {pkg}.utils import get_full_cls_name as g
from {pkg}.utils.serialization import b64decode as d, b64encode as e
class Outer:
    class Inner: pass
def f(): pass
print(json.dumps([g(ValueError), g(ValueError("x")), g(Outer), g(Outer.Inner), g(Outer()),
                  g(f), e("h\\u00e9llo"), e(b"\\x00\\x01"), d(e("h\\u00e9llo")).decode(),
                  list(d("AAE="))]))
"""


def test_the_helpers_django_celery_results_imports_answer_as_celerys() -> None:
    """Its backend imports ``b64encode``/``b64decode``, its views ``get_full_cls_name``."""
    python = celery_python()
    if not Path(python).exists():
        pytest.skip(no_celery_reason(python))
    theirs = subprocess.run([python, "-c", _NAMES_PROBE.format(pkg="celery")],
                            capture_output=True, text=True, timeout=60)
    ours = subprocess.run([sys.executable, "-c", _NAMES_PROBE.format(pkg="akadze_compat")],
                          capture_output=True, text=True, timeout=60)
    assert theirs.returncode == ours.returncode == 0, theirs.stderr + ours.stderr
    assert json.loads(ours.stdout) == json.loads(theirs.stdout)
