"""``billiard.einfo``: the ``einfo`` that ``on_failure``, ``on_retry`` and ``task_failure`` get."""

from __future__ import annotations

from ..app.trace import ExceptionInfo

__all__ = ["ExceptionInfo", "ExceptionWithTraceback"]


class ExceptionWithTraceback(Exception):
    """An exception with its formatted traceback, as billiard's pool sends a failure back
    (``exc`` is the exception, ``tb`` the text); code unwraps it with ``.exc``."""

    def __init__(self, exc: BaseException, tb: str) -> None:
        self.exc = exc
        self.tb = tb
        super().__init__(exc, tb)

    def __str__(self) -> str:
        return self.tb
