"""Settings: Celery's configuration object (``app.conf``), read live at lookup time.

A lookup walks four layers, first hit wins: the changes made on the app (``Celery(**config)``,
``conf.update()``, ``conf.x = ...``), the configuration source (``config_from_object``),
defaults added with ``app.add_defaults``, then Celery's defaults. In every layer a name is
looked up under each of its spellings: the new name (``task_always_eager``), the old
upper-case one (``CELERY_ALWAYS_EAGER``) and, with a namespace, the prefixed one
(``CELERY_TASK_ALWAYS_EAGER``). The source is never copied: an object or module is read
with ``getattr`` at every lookup, so changing the Django settings object later is seen.

Values computed from settings on every send (the router, the serializer check, the default
time limits) are kept with ``Settings.derived`` instead: rebuilt after any change made
through ``conf`` (or a new source), but not after a change inside a live source. Celery
itself reads those once, when the task is bound or the router first used.
"""

from __future__ import annotations

import copy
import importlib
import os
import threading
import types
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..exceptions import ImproperlyConfigured
from . import defaults as _defaults

__all__ = ["ObjectView", "Settings", "database_url", "import_object", "load_source", "retention",
           "source_mapping"]

_POSTGRES_SCHEMES = {"postgres", "postgresql"}

T = TypeVar("T")

_HIDDEN = ("API", "TOKEN", "KEY", "SECRET", "PASS", "SIGNATURE", "DATABASE", "URL")

#: A value no layer holds: ``dict.get`` with it tells a miss from a stored None without the
#: cost of raising KeyError.
_MISSING = object()

#: Distinct keys whose spellings are remembered per Settings (programs look up a few dozen;
#: the bound only stops a program reading made-up names from growing the cache forever).
_SPELLINGS_CACHE_SIZE = 1024


def import_object(path: str) -> Any:
    """Import ``"module"``, ``"module:attr"`` or ``"module.attr"`` (Celery's rules).

    With a colon the part after it is an attribute path. Without one, the whole string is
    tried as a module first, then as ``module.attribute``.
    """
    if ":" in path:
        module_name, _, attribute = path.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
        return target
    try:
        return importlib.import_module(path)
    except ImportError:
        module_name, _, attribute = path.rpartition(".")
        if not module_name:
            raise
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except AttributeError:
            raise ImportError(f"cannot import {path!r}: no module or attribute of that name") \
                from None


class ObjectView(Mapping[str, Any]):
    """An object (module, class, Django settings) seen as a mapping of its attributes.

    Every lookup is a fresh ``getattr``, so the view follows changes to the object.
    """

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self.obj, key)
        except AttributeError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return (name for name in dir(self.obj) if not name.startswith("_"))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"ObjectView({self.obj!r})"


def _module_dict(obj: Any) -> dict[str, Any] | None:
    """The ``__dict__`` of ``obj`` if it is a plain module (without a module ``__getattr__``),
    else None."""
    if type(obj) is not types.ModuleType:
        return None
    namespace: dict[str, Any] = obj.__dict__
    return None if "__getattr__" in namespace else namespace


def source_mapping(source: Any) -> Mapping[str, Any]:
    """A live mapping view of a configuration source (a mapping is used as it is)."""
    if isinstance(source, Mapping):
        return source
    return ObjectView(source)


def _match_case(text: str, like: str) -> str:
    return text.upper() if like.isupper() else text.lower() if like.islower() else text


class Settings(MutableMapping[str, Any]):
    """Celery's settings object: mapping and attribute access, old and namespaced names.

    ``changes`` are the values set on the app; ``namespace`` (``"CELERY"``) makes
    ``conf.task_always_eager`` also read ``CELERY_TASK_ALWAYS_EAGER``. ``on_first_read`` is
    called once, before the first lookup (the app loads its configuration source then, so
    ``config_from_object("django.conf:settings")`` imports nothing until it is needed).
    """

    def __init__(
        self,
        changes: MutableMapping[str, Any] | None = None,
        *,
        namespace: str | None = None,
        on_first_read: Callable[[], None] | None = None,
    ) -> None:
        state = self.__dict__
        state["changes"] = {} if changes is None else changes
        state["source"] = None
        state["added_defaults"] = []
        state["defaults"] = copy.deepcopy(_defaults.DEFAULTS)
        state["prefix"] = None
        state["_on_first_read"] = on_first_read
        state["_loading"] = threading.RLock()
        # Lookups are hot (``delay()`` makes several): the spellings of each key and the
        # list of layers are computed once, not per lookup. Both caches only hold what the
        # layers *are*, never a value read from them, so every lookup still reads each layer
        # live. They are replaced whenever the namespace, source or added defaults change.
        state["_spellings_cache"] = {}
        state["_layers_lock"] = threading.Lock()
        state["_layers_cache"] = ()
        # Values derived from settings (``derived``) are kept until the generation moves.
        state["_generation"] = 0
        state["_derived"] = {}
        self._refresh_layers()
        self.set_namespace(namespace)

    # --- configuration --------------------------------------------------------------------

    def set_namespace(self, namespace: str | None) -> None:
        """Read ``<NAMESPACE>_<setting>`` names too (``None`` turns the namespace off)."""
        self.__dict__["prefix"] = f"{namespace.rstrip('_')}_" if namespace else None
        self.__dict__["_spellings_cache"] = {}
        self._changed()

    @property
    def namespace(self) -> str | None:
        """The namespace without its trailing underscore, or None."""
        prefix = self.__dict__["prefix"]
        return prefix[:-1] if prefix else None

    def set_source(self, source: Any) -> None:
        """Use ``source`` (a mapping or an object, read live) as the configuration source."""
        with self.__dict__["_layers_lock"]:
            self.__dict__["source"] = None if source is None else source_mapping(source)
            self._refresh_layers()

    def add_defaults(self, mapping: Mapping[str, Any]) -> None:
        """Add a layer of defaults, consulted after the source and before Celery's."""
        with self.__dict__["_layers_lock"]:
            self.__dict__["added_defaults"].insert(0, mapping)
            self._refresh_layers()

    def _ensure_loaded(self) -> None:
        if self.__dict__["_on_first_read"] is None:
            return
        with self.__dict__["_loading"]:
            callback = self.__dict__["_on_first_read"]
            # Cleared first: the callback (and on_after_configure receivers) read settings.
            self.__dict__["_on_first_read"] = None
            if callback is not None:
                callback()

    # --- lookup -------------------------------------------------------------------------------

    def _layers(self) -> list[Mapping[str, Any]]:
        return list(self.__dict__["_layers_cache"])

    def _changed(self) -> None:
        # Not atomic across threads, and need not be: any bump makes ``derived`` rebuild.
        self.__dict__["_generation"] += 1

    def _refresh_layers(self) -> None:
        # Called with _layers_lock held (or from __init__): the whole tuple is replaced at
        # once, so a concurrent lookup sees either the old layers or the new ones.
        state = self.__dict__
        layers: list[Mapping[str, Any]] = [state["changes"]]
        if state["source"] is not None:
            layers.append(state["source"])
        state["_layers_cache"] = (*layers, *state["added_defaults"], state["defaults"])
        self._changed()

    def spellings(self, key: str) -> list[str]:
        """Every name ``key`` may be stored under, in the order they are tried."""
        return list(self._spellings(key))

    def _spellings(self, key: str) -> tuple[str, ...]:
        cache = self.__dict__["_spellings_cache"]
        names = cache.get(key)
        if names is None:
            names = self._spell(key)
            if len(cache) < _SPELLINGS_CACHE_SIZE:
                cache[key] = names
        return names

    def _spell(self, key: str) -> tuple[str, ...]:
        prefix = self.__dict__["prefix"]
        names = []
        if prefix:
            names.append(key if key.startswith(prefix) else _match_case(prefix + key, prefix))
        names.append(key)
        new = _defaults.TO_NEW_NAME.get(key)
        if prefix and key.startswith(prefix):
            # CELERY_TASK_ALWAYS_EAGER given: also try task_always_eager and its old name.
            new = new or key[len(prefix):].lower()
        names.append(new or key)
        names.append(_defaults.TO_OLD_NAME.get(new or key, key))
        return tuple(dict.fromkeys(names))

    def __getitem__(self, key: str) -> Any:
        state = self.__dict__
        if state["_on_first_read"] is not None:
            self._ensure_loaded()
        names = state["_spellings_cache"].get(key) or self._spellings(key)
        for layer in state["_layers_cache"]:
            if type(layer) is dict:
                # The common layers (changes, defaults) are plain dicts: a sentinel get is
                # the same lookup without raising and catching KeyError per miss.
                for name in names:
                    value = layer.get(name, _MISSING)
                    if value is not _MISSING:
                        return value
            elif type(layer) is ObjectView:
                # A settings module or object. Most lookups miss the source and end in the
                # defaults, and a miss by getattr() raises (and formats) an AttributeError,
                # then a KeyError, per spelling: 1-2 us each. A plain module (no module
                # __getattr__) is read from its __dict__, which for names that are not
                # dunders is exactly what getattr() sees; other objects get getattr() with a
                # default, which skips the KeyError.
                obj = layer.obj
                namespace = _module_dict(obj)
                for name in names:
                    if namespace is not None and not name.startswith("__"):
                        value = namespace.get(name, _MISSING)
                    else:
                        value = getattr(obj, name, _MISSING)
                    if value is not _MISSING:
                        return value
            else:
                for name in names:
                    try:
                        return layer[name]
                    except KeyError:
                        pass
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __setitem__(self, key: str, value: Any) -> None:
        self.__dict__["changes"][key] = value
        self._changed()

    def __delitem__(self, key: str) -> None:
        del self.__dict__["changes"][key]
        self._changed()

    def __iter__(self) -> Iterator[str]:
        self._ensure_loaded()
        seen: dict[str, None] = {}
        for layer in reversed(self._layers()):
            seen.update(dict.fromkeys(layer))
        return iter(seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no setting {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        attribute = getattr(type(self), name, None)
        if name.startswith("_") or (isinstance(attribute, property) and attribute.fset):
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __repr__(self) -> str:
        return f"<Settings namespace={self.namespace!r} changes={self.changes!r}>"

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Set several settings at once (``conf.update(task_always_eager=True)``)."""
        self.__dict__["changes"].update(*args, **kwargs)
        self._changed()

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Set ``key`` unless it already has a value (Celery's ``conf.setdefault``)."""
        if key not in self:
            self[key] = default
        return self[key]

    def first(self, *keys: str) -> Any:
        """The value of the first of ``keys`` that is set to something other than None."""
        for key in keys:
            value = self.get(key)
            if value is not None:
                return value
        return None

    def value_set_for(self, key: str) -> bool:
        """Whether ``key`` was set anywhere (changes or source), defaults not counted."""
        self._ensure_loaded()
        state = self.__dict__
        layers = [state["changes"], *([state["source"]] if state["source"] is not None else [])]
        names = self._spellings(key)
        return any(name in layer for layer in layers for name in names)

    # --- Celery's helpers ---------------------------------------------------------------------

    def find_option(self, name: str, namespace: str = "") -> _defaults.SearchResult:
        """``(namespace, key, default)`` of a setting found by its short name."""
        return _defaults.find(name, namespace or "celery")

    def find_value_for_key(self, name: str, namespace: str = "celery") -> Any:
        """The value of the setting ``find_option(name, namespace)`` finds."""
        found = self.find_option(name, namespace)
        return self.get_by_parts(found.namespace or "", found.key)

    def get_by_parts(self, *parts: str) -> Any:
        """``get_by_parts("worker", "concurrency")`` is ``conf["worker_concurrency"]``."""
        return self["_".join(part for part in parts if part)]

    def without_defaults(self) -> dict[str, Any]:
        """The settings that were set (changes over the source over the defaults added with
        ``add_defaults``), Celery's own defaults left out, as in Celery."""
        self._ensure_loaded()
        state = self.__dict__
        values: dict[str, Any] = {}
        for layer in reversed(state["added_defaults"]):
            values.update(layer)
        values.update(state["source"] or {})
        values.update(state["changes"])
        return values

    def table(self, with_defaults: bool = False, censored: bool = True) -> dict[str, Any]:
        """The settings as a dict; secrets (passwords, keys, URLs) masked unless ``censored``
        is False."""
        values = {key: self[key] for key in self} if with_defaults else self.without_defaults()
        result = {}
        for key, value in values.items():
            if key.startswith("_"):
                continue
            hidden = censored and any(word in key.upper() for word in _HIDDEN)
            result[key] = "********" if hidden and value else value
        return result

    def humanize(self, with_defaults: bool = False, censored: bool = True) -> str:
        """The settings as ``key: value`` lines."""
        return "\n".join(f"{key}: {value!r}"
                         for key, value in self.table(with_defaults, censored).items())

    def generation(self) -> int:
        """A number that moves whenever settings change through this object: set, updated or
        deleted here, or a new source, namespace or added defaults. Changes made inside a
        live source (an attribute of a settings module or of Django's settings changed in
        place) do not move it."""
        return int(self.__dict__["_generation"])

    def derived(self, key: str, build: Callable[[Settings, Any], T]) -> T:
        """A value computed from the settings, kept until ``generation()`` moves.

        ``build(settings, previous)`` makes it (``previous`` is the value it replaces, or
        None) so a builder can reuse the parts that did not change. Like Celery's own caches
        (its router is built once, at first use), a value kept here does not follow changes
        inside a live source; unlike them, it follows every change made through ``conf``.
        """
        state = self.__dict__
        if state["_on_first_read"] is not None:
            self._ensure_loaded()  # loading sets the source: build after it, not before
        # Read first: a change while building leaves the value stale, so the next call
        # (which sees a newer generation) builds it again.
        generation = state["_generation"]
        cached = state["_derived"].get(key)
        if cached is not None and cached[0] == generation:
            return cached[1]  # type: ignore[no-any-return]
        value = build(self, None if cached is None else cached[1])
        state["_derived"][key] = (generation, value)
        return value

    def finalize(self) -> Settings:
        """Load the configuration now (it is otherwise loaded at the first lookup)."""
        self._ensure_loaded()
        return self

    # --- settings Celery computes -------------------------------------------------------------

    @property
    def broker_url(self) -> str | None:
        """``$CELERY_BROKER_URL``, else ``broker_url``, else ``broker_host`` (Celery's order)."""
        return os.environ.get("CELERY_BROKER_URL") or self.first("broker_url", "broker_host")

    @broker_url.setter
    def broker_url(self, value: str | None) -> None:
        self["broker_url"] = value

    @property
    def result_backend(self) -> Any:
        """``$CELERY_RESULT_BACKEND``, else ``result_backend`` (accepted and ignored)."""
        return os.environ.get("CELERY_RESULT_BACKEND") or self.first("result_backend")

    @result_backend.setter
    def result_backend(self, value: Any) -> None:
        self["result_backend"] = value

    @property
    def task_default_exchange(self) -> Any:
        """``task_default_exchange``, else the default queue's name."""
        return self.first("task_default_exchange", "task_default_queue")

    @property
    def task_default_routing_key(self) -> Any:
        """``task_default_routing_key``, else the default queue's name."""
        return self.first("task_default_routing_key", "task_default_queue")

    @property
    def timezone(self) -> Any:
        """``timezone``, else Django's ``TIME_ZONE``."""
        return self.first("timezone", "TIME_ZONE")

    @timezone.setter
    def timezone(self, value: Any) -> None:
        self["timezone"] = value


def load_source(source: Any, silent: bool = False) -> Any:
    """Import a ``"module[:attr]"`` source; objects and mappings are returned as they are.

    ``silent`` turns import errors into None (Celery's ``config_from_object(silent=True)``);
    otherwise the ImportError propagates, as in Celery.
    """
    if not isinstance(source, str):
        return source
    try:
        return import_object(source)
    except (ImportError, AttributeError):
        if silent:
            return None
        raise


def database_url(broker_url: str | None) -> str | None:
    """The Postgres URL to use for ``broker_url``; ImproperlyConfigured if it is not one."""
    if not broker_url:
        return None
    if "://" not in broker_url and "=" in broker_url:
        return broker_url  # a libpq "host=... dbname=..." connection string
    scheme = broker_url.split("://", 1)[0].lower() if "://" in broker_url else ""
    # SQLAlchemy and kombu spellings: sqla+postgresql://, postgresql+psycopg://.
    base = scheme.removeprefix("sqla+").split("+", 1)[0]
    if base in _POSTGRES_SCHEMES:
        return f"postgresql://{broker_url.split('://', 1)[1]}"
    parts = urlsplit(broker_url)
    shown = broker_url.replace(f":{parts.password}@", ":****@") if parts.password else broker_url
    raise ImproperlyConfigured(
        f"broker_url {shown!r} is not a Postgres URL: akadze_compat keeps its queue in "
        "Postgres, there is no Redis or RabbitMQ broker. Change broker_url where the project "
        "sets it (Celery(broker=...) or its config) to postgresql://user@host/db, or "
        "override it with -b URL or $CELERY_BROKER_URL, which win over the setting "
        "($AKADZE_DATABASE_URL is used only when no broker_url is set).")


def retention(value: Any) -> timedelta:
    """A ``result_expires`` value as a retention: None/0 keeps results for a century."""
    if isinstance(value, timedelta):
        return value if value.total_seconds() > 0 else timedelta(days=36500)
    return timedelta(seconds=float(value)) if value else timedelta(days=36500)
