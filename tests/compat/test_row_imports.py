"""A failure's row never makes the reader import anything.

An error entry names the exception's module. Reading ``AsyncResult.result`` / ``.get()``
of a failed task, and a worker calling a ``link_error`` errback, rebuild the exception
from it; they must only look in modules already imported (Celery 5.7 does the same since
CVE-2021-23727). Here the module named is a real one on ``sys.path`` whose import writes a
marker file: the marker must never appear, and the exception still comes back with the
stored name and arguments (a stand-in class).
"""

from __future__ import annotations

import importlib
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_compat import Celery, states
from akadze_compat.backends.base import exception_from_entry
from tests.compat.conftest import work


class Probe:
    """A module on ``sys.path`` that no one has imported, and the marker its import writes."""

    def __init__(self, directory: Path) -> None:
        self.name = f"akadze_row_probe_{uuid.uuid4().hex[:10]}"
        self.marker = directory / f"{self.name}.imported"
        (directory / f"{self.name}.py").write_text(
            "from pathlib import Path\n"
            f"Path({str(self.marker)!r}).write_text('imported')\n"
            "class Boom(Exception):\n"
            "    pass\n")

    def imported(self) -> bool:
        """Whether the module ran (its marker exists) or is in ``sys.modules``."""
        return self.marker.exists() or self.name in sys.modules


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    monkeypatch.syspath_prepend(str(tmp_path))
    made = Probe(tmp_path)
    yield made
    sys.modules.pop(made.name, None)


def claiming(module: str) -> type[Exception]:
    """An exception class that says it lives in ``module`` (its row will name it)."""
    return type("Boom", (Exception,), {"__module__": module})


async def test_a_failed_result_and_its_errback_never_import_the_module_the_row_names(
        celery: Celery, db: psycopg.Connection, probe: Probe) -> None:
    boom = claiming(probe.name)
    seen: list[Any] = []

    @celery.task(name="t.fail")
    def fail() -> None:
        raise boom("card declined", 42)

    @celery.task(name="t.on_error")
    def on_error(request: Any, exc: BaseException, traceback: Any) -> None:
        seen.append((type(exc).__name__, type(exc).__module__, exc.args,
                     isinstance(exc, Exception)))

    result = fail.apply_async(link_error=on_error.s())
    await work(celery, lambda: bool(seen))
    stored = db.execute("SELECT errors->-1->>'module', errors->-1->>'type' FROM akadze.jobs "
                        "WHERE meta->>'task_id' = %s", [result.id]).fetchone()
    assert stored == (probe.name, "Boom")
    # The worker's errback got the failure with its stored name, module and args.
    assert seen == [("Boom", probe.name, ("card declined", 42), True)]
    assert not probe.imported()

    fresh = celery.AsyncResult(result.id)
    assert fresh.state == states.FAILURE
    exc = fresh.result
    assert (type(exc).__name__, type(exc).__module__) == ("Boom", probe.name)
    assert exc.args == ("card declined", 42)
    assert str(exc) == str(boom("card declined", 42))
    with pytest.raises(Exception) as raised:
        celery.AsyncResult(result.id).get(timeout=5)
    assert type(raised.value).__name__ == "Boom" and raised.value.args == ("card declined", 42)
    assert not probe.imported()

    # Once the reader has imported the module itself, the real class comes back.
    module = importlib.import_module(probe.name)
    with pytest.raises(module.Boom):
        celery.AsyncResult(result.id).get(timeout=5)


def test_a_lazy_module_getattr_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module already imported may import more on attribute access (PEP 562's
    ``__getattr__``): the class is read from its namespace only, so that never runs."""
    calls: list[str] = []
    lazy = types.ModuleType("akadze_lazy_probe")

    def lazy_getattr(name: str) -> Any:
        calls.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = lazy_getattr  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, lazy.__name__, lazy)
    made = exception_from_entry({"type": "Boom", "module": lazy.__name__, "message": "m"})
    assert (type(made).__name__, made.args, calls) == ("Boom", ("m",), [])


def test_only_an_exception_class_is_taken_from_a_module() -> None:
    """A row naming a function, a module attribute that is not a class, or a
    BaseException that would stop the reader gets a stand-in exception instead."""
    for module, name in (("os", "system"), ("os", "environ"), ("builtins", "SystemExit"),
                         ("builtins", "KeyboardInterrupt"), ("builtins", "eval")):
        made = exception_from_entry({"type": name, "module": module, "args": ["x"]})
        assert type(made).__bases__ == (Exception,) and type(made).__name__ == name
        assert made.args == ("x",)
