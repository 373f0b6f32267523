"""Sync/async twins in akadze_core follow one naming rule.

One face of an operation has the plain name; its twin is that name plus ``_async`` (the
coroutine) or ``_sync`` (the plain call). The plain name is the face the seeds spell
(``await request_cancel(...)``, ``await requeue(...)``, ``.enqueue(...)``), else the face of
its neighbours: async for what runs in a worker's loop (``Worker.run``,
``JobContext.update_meta``), sync for what application code calls (``App``, ``Task``,
``lookup``); a name without a twin has no suffix. No ``a``/``async_`` prefixes, no pair
with both names suffixed. Names from before the rule stay as aliases, listed in ``ALIASES``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import akadze_core

#: (namespace, old name) -> the rule's name: kept so that callers keep working.
ALIASES = {
    ("akadze_core.store.database", "autovacuum_runs_async"): "autovacuum_runs",
}


#: Integrations implement another framework's interface, in its names (Django's
#: ``aenqueue``, ``aget_result``), and import that framework, which may not be installed.
FRAMEWORKS = "akadze_core.contrib."


def _modules() -> Iterator[Any]:
    yield akadze_core
    for info in pkgutil.walk_packages(akadze_core.__path__, "akadze_core."):
        if not info.name.startswith(FRAMEWORKS):
            yield importlib.import_module(info.name)


def _namespaces() -> dict[str, dict[str, Any]]:
    """Every module's and every public class's public callables, by qualified name."""
    spaces: dict[str, dict[str, Any]] = {}
    for module in _modules():
        names = spaces.setdefault(module.__name__, {})
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if inspect.isclass(value) and value.__module__ == module.__name__:
                members = spaces.setdefault(f"{module.__name__}.{name}", {})
                for member in dir(value):
                    attribute = inspect.getattr_static(value, member)
                    if isinstance(attribute, staticmethod | classmethod):
                        attribute = attribute.__func__
                    if not member.startswith("_") and inspect.isfunction(attribute):
                        members[member] = attribute
            elif inspect.isfunction(value) and (value.__module__ == module.__name__
                                                or name in getattr(module, "__all__", ())):
                names[name] = value  # defined here, or exported (the package's names)
    return spaces


def _is_async(value: Any) -> bool:
    return inspect.iscoroutinefunction(value)


def _breaks(space: str, names: dict[str, Any]) -> list[str]:
    """What in one namespace breaks the rule (aliases checked apart)."""
    names = {name: value for name, value in names.items() if (space, name) not in ALIASES}
    found = []
    for name, value in sorted(names.items()):
        where = f"{space}.{name}"
        for suffix, must_be_async in (("_async", True), ("_sync", False)):
            if not name.endswith(suffix):
                continue
            base = name.removesuffix(suffix)
            if _is_async(value) != must_be_async:
                found.append(f"{where}: a {suffix} name on a "
                             f"{'plain' if must_be_async else 'coroutine'} function")
            if base in names and _is_async(names[base]) == must_be_async:
                found.append(f"{where}: its twin {base} is the same kind")
            other = base + ("_sync" if must_be_async else "_async")
            if must_be_async and other in names:
                found.append(f"{where}: both twins are suffixed ({other})")
        if name.endswith("_sync") and name.removesuffix("_sync") not in names:
            found.append(f"{where}: a _sync twin without its plain async name")
        if name.endswith("_async") and name.removesuffix("_async") not in names:
            found.append(f"{where}: an _async name without a twin (a lone one is plain)")
        for prefix in ("async_", "a"):
            base = name.removeprefix(prefix)
            if base != name and base in names and _is_async(value) \
                    and not _is_async(names[base]):
                found.append(f"{where}: prefix {prefix!r}; the rule's name is {base}_async")
    return found


def test_every_twin_follows_the_naming_rule() -> None:
    spaces = _namespaces()
    assert "request_cancel_sync" in spaces["akadze_core.ops.control"]  # the walk sees them
    assert "update_meta_sync" in spaces["akadze_core.execution.context.JobContext"]
    assert [line for space, names in spaces.items() for line in _breaks(space, names)] == []


def test_the_older_names_are_aliases_of_the_rules_names() -> None:
    spaces = _namespaces()
    for (space, old), new in ALIASES.items():
        assert spaces[space][old] is spaces[space][new], (space, old)


def test_the_apps_pre_release_aliases_are_gone() -> None:
    # Deleted before the first release rather than kept: one name per operation.
    for old in ("aclose", "run_sync", "run_async"):
        assert not hasattr(akadze_core.App, old), old


def test_the_check_catches_the_spellings_the_rule_rules_out() -> None:
    async def coroutine() -> None: ...

    def plain() -> None: ...

    space = {"close": plain, "aclose": coroutine, "run_sync": plain, "run_async": coroutine,
             "get": plain, "async_get": coroutine, "stop_async": plain, "wait_sync": plain,
             "poll_async": coroutine}
    broken = _breaks("demo", space)
    assert any("demo.aclose: prefix 'a'" in line for line in broken)
    assert any("demo.async_get: prefix 'async_'" in line for line in broken)
    assert any("demo.run_async: both twins are suffixed" in line for line in broken)
    assert any("demo.stop_async: a _async name on a plain function" in line for line in broken)
    assert any("demo.wait_sync: a _sync twin without its plain async name" in line
               for line in broken)
    assert any("demo.poll_async: an _async name without a twin" in line for line in broken)
