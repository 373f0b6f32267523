"""Records Celery-style signal deliveries in tests."""

from __future__ import annotations

from typing import Any

from akadze_compat import signals


class Recorder:
    """Collects signal deliveries (kept alive: signals hold receivers weakly)."""

    def __init__(self, *names: str) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._receivers: list[tuple[str, Any]] = []
        for name in names:
            receiver = self._make(name)
            getattr(signals, name).connect(receiver)
            self._receivers.append((name, receiver))

    def _make(self, name: str) -> Any:
        def receiver(sender: Any = None, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            self.calls.append((name, {"sender": sender, **kwargs}))
        return receiver

    def names(self) -> list[str]:
        """The names of the signals received, in order."""
        return [name for name, _ in self.calls]

    def close(self) -> None:
        """Disconnect every receiver."""
        for name, receiver in self._receivers:
            getattr(signals, name).disconnect(receiver)
