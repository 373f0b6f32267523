"""Celery names that akadze_compat keeps out on purpose, and the error that says why.

A module with such names ends with ``__getattr__ = not_provided(__name__, {...})``: importing
one (``from akadze_compat.beat import PersistentScheduler``) raises ``NotProvided``, an
``ImportError`` whose message names the migration guide's section, instead of Python's bare
"cannot import name". ``doctor`` reports these names as missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["GUIDE", "NotProvided", "not_provided"]

#: Where the reasons are written down (anchors are the section titles, GitHub style).
GUIDE = "migration_guide/celery.md"


class NotProvided(ImportError):
    """A Celery name akadze_compat does not provide (an ImportError, so ``from x import y``
    fails at the import with this message; ``hasattr`` does not hide it)."""


def not_provided(module: str, names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` raising ``NotProvided`` for each of ``names`` (name ->
    (what to do instead, guide section anchor)) and AttributeError for any other name."""

    def __getattr__(name: str) -> Any:
        if name in names:
            why, section = names[name]
            raise NotProvided(f"{module}.{name} (Celery's) is not provided by akadze_compat: "
                              f"{why} (see {GUIDE}#{section})", name=name, path=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
