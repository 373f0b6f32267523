"""``self.request``: the ``Context`` of one task call (Celery's ``celery.app.task.Context``).

Built by the worker from the job (``entry.build_request``), by ``apply()`` for eager runs,
and a default one outside any call; ``Task.request`` returns the innermost of the stack.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Context"]


class Context:
    """The request of a task call (``self.request``): Celery's attributes and defaults."""

    args: Any = None
    callbacks: Any = None
    called_directly = True
    chain: Any = None
    chord: Any = None
    correlation_id: str | None = None
    delivery_info: dict[str, Any] | None = None
    errbacks: Any = None
    eta: str | None = None
    expires: str | None = None
    group: str | None = None
    group_index: int | None = None
    headers: dict[str, Any] | None = None
    hostname: str | None = None
    id: str | None = None
    ignore_result = False
    is_eager = False
    kwargs: Any = None
    logfile: str | None = None
    loglevel: int | None = None
    origin: str | None = None
    parent_id: str | None = None
    retries = 0
    reply_to: str | None = None
    replaced_task_nesting = 0
    root_id: str | None = None
    shadow: str | None = None
    task: str | None = None
    taskset: str | None = None
    timelimit: Any = None
    time_limit: float | None = None
    soft_time_limit: float | None = None
    utc: bool | None = None
    stamped_headers: Any = None
    stamps: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.update(*args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Set attributes from a mapping and/or keywords (``timelimit`` fills both limits)."""
        values = dict(*args, **kwargs)
        self.__dict__.update(values)
        if "timelimit" in values:
            limits = values["timelimit"]
            hard, soft = (limits[0], limits[1]) if isinstance(limits, (list, tuple)) \
                and len(limits) >= 2 else (None, None)
            self.__dict__.update(time_limit=hard, soft_time_limit=soft)

    @classmethod
    def from_attributes(cls, attributes: dict[str, Any]) -> Context:
        """A request whose attributes are ``attributes`` itself (taken over, not copied).

        The worker's per-job constructor: it builds the complete dict (both limits already
        set from ``timelimit``), so ``update``'s copy and checks would only cost time.
        """
        request = cls.__new__(cls)
        request.__dict__ = attributes
        return request

    def clear(self) -> None:
        """Drop every attribute set on this request."""
        self.__dict__.clear()

    def get(self, key: str, default: Any = None) -> Any:
        """An attribute, or ``default``."""
        return getattr(self, key, default)

    @property
    def properties(self) -> dict[str, Any] | None:
        """The message properties of the call (Celery's ``request.properties``).

        A worker run builds them only when read: ``correlation_id`` (the task id),
        ``reply_to``, ``delivery_mode``, ``delivery_info``, ``priority``, and the message
        properties the caller passed to ``apply_async`` (``app_id``, ``user_id``, ``type``,
        ``message_id``...), kept in the job's meta. None outside a worker run unless set.
        """
        values = self.__dict__
        if "properties" in values:
            return values["properties"]  # type: ignore[no-any-return]
        meta = values.get("_akadze_meta")
        if meta is None:
            return None
        delivery = values.get("delivery_info") or {}
        kept = meta.get("properties")
        properties = {
            "correlation_id": values.get("id"), "reply_to": values.get("reply_to") or "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": delivery.get("exchange") or "",
                              "routing_key": delivery.get("routing_key")},
            "priority": delivery.get("priority"),
            **(kept if isinstance(kept, dict) else {}),
        }
        values["properties"] = properties
        return properties

    @properties.setter
    def properties(self, value: dict[str, Any] | None) -> None:
        self.__dict__["properties"] = value

    @property
    def children(self) -> list[Any]:
        """Results of the tasks this one started (kept for Celery code that reads it)."""
        return self.__dict__.setdefault("_children", [])

    def __repr__(self) -> str:
        return f"<Context: {vars(self)!r}>"
