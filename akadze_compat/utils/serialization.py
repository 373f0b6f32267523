"""``celery.utils.serialization``: the wrapper a failure comes back in when its class
cannot be rebuilt.

Results are JSON, never pickles: a failure is stored as its class's module and name and the
arguments it was raised with, and read back as that class called with them. When that call
fails (a constructor wanting other arguments than the exception's ``args``, a class that
cannot be instantiated from outside), the reader gets an ``UnpickleableExceptionWrapper``
holding the class's name, module and arguments, as Celery hands back an exception it cannot
restore.
"""

from __future__ import annotations

import base64
from typing import Any

from ..utils.unsupported import not_provided

__all__ = ["UnpickleableExceptionWrapper", "b64decode", "b64encode"]


def b64encode(value: str | bytes) -> str:
    """``value`` (text is UTF-8 encoded first) in base64, as text (Celery's helper, which
    result stores use for binary payloads)."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    return base64.b64encode(data).decode("ascii")


def b64decode(value: str | bytes) -> bytes:
    """The bytes that :func:`b64encode` encoded."""
    data = value.encode("ascii") if isinstance(value, str) else value
    return base64.b64decode(data)


class UnpickleableExceptionWrapper(Exception):
    """An exception that could not be rebuilt: its module, class name and arguments."""

    #: The module of the original exception.
    exc_module: str | None = None
    #: The name of the original exception class.
    exc_cls_name: str | None = None
    #: The arguments of the original exception.
    exc_args: tuple[Any, ...] | None = None

    def __init__(self, exc_module: str | None, exc_cls_name: str, exc_args: Any,
                 text: str | None = None) -> None:
        self.exc_module = exc_module
        self.exc_cls_name = exc_cls_name
        self.exc_args = tuple(exc_args or ())
        self.text = text if text is not None else \
            f"{exc_cls_name}({', '.join(repr(arg) for arg in self.exc_args)})"
        super().__init__(exc_module, exc_cls_name, self.exc_args, self.text)

    def restore(self) -> Exception:
        """An exception of a new class with the original's name, called with its args."""
        cls = type(self.exc_cls_name or "Exception", (Exception,),
                   {"__module__": self.exc_module or "builtins"})
        return cls(*(self.exc_args or ()))

    def __str__(self) -> str:
        return self.text

    @classmethod
    def from_exception(cls, exc: BaseException) -> UnpickleableExceptionWrapper:
        """The wrapper of ``exc``."""
        return cls(type(exc).__module__, type(exc).__name__, getattr(exc, "args", ()),
                   repr(exc)).with_traceback(exc.__traceback__)


__getattr__ = not_provided(__name__, {
    name: ("results are JSON, never pickles: there is nothing to make picklable",
           "results-live-in-postgres")
    for name in ("get_pickleable_exception", "get_pickleable_etype",
                 "get_pickled_exception", "find_pickleable_exception", "subclass_exception",
                 "create_exception_cls", "strtobool", "raise_with_context")})
