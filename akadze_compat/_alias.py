"""The celery alias's machinery (``akadze_compat.as_celery`` is the public switch): make
``import celery`` (and the ``billiard`` names add-ons use) resolve to akadze_compat.

``install()`` switches it on; importing ``akadze_compat.as_celery`` calls it; so does
``AKADZE_CELERY=1`` in the environment (read at interpreter start by the ``akadze-celery.pth``
file installed with the package), and the ``akadze-compat`` command calls it for itself and
its children. With the alias on, a Celery project and the packages it uses (Sentry, tracing
agents, django-celery-results, ...) run on akadze with no change to their imports.

How: a finder placed first in ``sys.meta_path`` answers for ``celery`` and every
``celery.<sub>`` with the module ``akadze_compat.<sub>`` itself, and for ``billiard`` /
``billiard.<sub>`` with ``akadze_compat._billiard[.<sub>]``. A real celery that pip installed
as an add-on's dependency is never loaded while the alias is on (one imported before is
dropped from ``sys.modules``); with the alias off nothing here runs.

The module object is the same under both names (``celery.Task is akadze_compat.Task``), and
every akadze module has its celery name as soon as it is loaded: the modules loaded when the
alias is switched on get theirs then, and the finder gives each one loaded later its celery
name right after it runs. So the agents' post-import hooks, which wait for a module name
(New Relic's, ddtrace's, wrapt's), fire for ``celery.app.trace`` and the rest as they do on
Celery, once each: a hook registered after the module is loaded runs at once, and one
registered before runs when the alias import goes through the finder the agent put in front
of this one. Those finders look their hooks up by the module's ``__name__`` when its loader
returns, so the alias loader leaves the celery name there; it is put back to akadze's once
the alias import is over, except for a module first imported by its celery name, which keeps
it. The ``__spec__`` (and so reload, pickling by reference, ``python -m``) stays akadze's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["ENV_VAR", "AliasFinder", "alias_name", "disabled_by_env", "enabled_by_env",
           "install", "installed", "target_name"]

#: The environment variable that switches the alias on at interpreter start.
ENV_VAR = "AKADZE_CELERY"

# Alias top-level name -> the akadze package that answers for it.
_ROOTS = {"celery": "akadze_compat", "billiard": "akadze_compat._billiard"}
_OWN_ROOT = "akadze_compat"
_BILLIARD = "akadze_compat._billiard"

_lock = threading.RLock()


class _InProgress(threading.local):
    """Per thread: the akadze names the finder is asking the other finders about, and the
    alias names being imported (whose akadze module must not import them again)."""

    def __init__(self) -> None:
        self.finding: set[str] = set()
        self.aliasing: set[str] = set()


_progress = _InProgress()


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """Whether ``AKADZE_CELERY`` asks for the alias (``1``, ``true``, ``yes`` or ``on``)."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def disabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """Whether ``AKADZE_CELERY`` refuses the alias (``0``, ``false``, ``no`` or ``off``): the
    ``akadze-compat`` command, which turns it on by default, then leaves ``celery`` alone."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in {"0", "false", "no", "off"}


def target_name(fullname: str) -> str | None:
    """The akadze module that answers for ``fullname`` (``celery.app.task`` ->
    ``akadze_compat.app.task``), or None for a name the alias leaves alone."""
    root, dot, rest = fullname.partition(".")
    target = _ROOTS.get(root)
    if target is None:
        return None
    return target + dot + rest


def alias_name(own: str) -> str | None:
    """The alias name of an akadze module (``akadze_compat.app.task`` -> ``celery.app.task``,
    ``akadze_compat._billiard.einfo`` -> ``billiard.einfo``); None for akadze's private
    modules, which Celery does not have (``_state`` excepted: Celery has ``celery._state``)."""
    if own == _BILLIARD or own.startswith(_BILLIARD + "."):
        return "billiard" + own[len(_BILLIARD):]
    if own != _OWN_ROOT and not own.startswith(_OWN_ROOT + "."):
        return None
    rest = own[len(_OWN_ROOT):]
    if any(part.startswith("_") and part != "_state" for part in rest.split(".")[1:]):
        return None
    return "celery" + rest


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the akadze module itself, to register under the alias name."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _progress.aliasing.add(spec.name)
        try:
            module = importlib.import_module(self.target)
        finally:
            _progress.aliasing.discard(spec.name)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran under its own name already. The import system has just set the
        # alias spec on it (it always overwrites ``__spec__``): put the module's own back.
        alias = module.__spec__.name if module.__spec__ is not None else module.__name__
        if self.own_spec is not None:
            module.__spec__ = self.own_spec
        # The agents' loaders that wrap this one look their hooks up by ``__name__`` once
        # this returns.
        module.__name__ = alias


class _OwnLoader(importlib.abc.Loader):
    """Loads an akadze module as usual, then imports it under its alias name too."""

    def __init__(self, loader: Any, alias: str) -> None:
        self.loader = loader
        self.alias = alias

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # The module and its spec keep the real loader (resources, get_source, reload).
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        # Already in sys.modules under its own name, where the alias import finds it; not
        # when that alias import is what loads it.
        if self.alias not in _progress.aliasing:
            _import_alias(self.alias, module)


def _import_alias(alias: str, module: ModuleType) -> None:
    """Import ``module`` (loaded) under ``alias``, then give it back its own ``__name__``
    (hooks waiting for the akadze name, if any, see that one)."""
    own = module.__name__
    try:
        importlib.import_module(alias)
    finally:
        module.__name__ = own


class AliasFinder(importlib.abc.MetaPathFinder):
    """The ``sys.meta_path`` entry that maps ``celery.*`` and ``billiard.*`` to akadze, and
    gives akadze modules loaded later their alias names."""

    def find_spec(self, fullname: str, path: Any = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """A spec for an alias name whose akadze module exists, or for an akadze module
        that also takes its alias name once loaded; None otherwise."""
        name = target_name(fullname)
        if name is None:
            return self._own_spec(fullname)
        try:
            own = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            own = None
        if own is None:
            # Never fall through to a real celery/billiard on disk (the import system
            # searches the parent's __path__, akadze's, next): half of one and half of the
            # other would mix two Task classes.
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(name), origin=own.origin,
            is_package=own.submodule_search_locations is not None)
        if own.submodule_search_locations is not None:
            spec.submodule_search_locations = list(own.submodule_search_locations)
        spec.has_location = own.has_location
        return spec

    def _own_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        alias = alias_name(fullname)
        if alias is None or fullname in _progress.finding:
            return None
        _progress.finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer
        finally:
            _progress.finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _OwnLoader(spec.loader, alias)
        return spec


def installed() -> bool:
    """Whether the alias finder is in ``sys.meta_path``."""
    return any(isinstance(finder, AliasFinder) for finder in sys.meta_path)


def _evict_real() -> None:
    # A real celery imported before the switch would keep answering from sys.modules.
    for name in list(sys.modules):
        target = target_name(name)
        if target is None:
            continue
        spec = getattr(sys.modules[name], "__spec__", None)
        if getattr(spec, "name", None) != target:
            del sys.modules[name]


def _alias_loaded() -> None:
    # The akadze modules already loaded take their alias names now (parents first).
    for own in sorted(name for name in list(sys.modules) if alias_name(name) is not None):
        alias = alias_name(own)
        if alias is not None and alias not in sys.modules:
            _import_alias(alias, sys.modules[own])


def install() -> None:
    """Switch the alias on for this process (again: no effect) and for the processes it
    starts (``AKADZE_CELERY=1`` is set in ``os.environ``)."""
    with _lock:
        os.environ[ENV_VAR] = "1"
        if installed():
            return
        _evict_real()
        sys.meta_path.insert(0, AliasFinder())
        _alias_loaded()
