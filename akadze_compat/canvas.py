"""Signatures (``celery.canvas``): a task call kept as data, for ``add_periodic_task`` and
``link=``/``link_error=``.

``Signature`` is a dict, as in Celery (``{"task", "args", "kwargs", "options",
"subtask_type", "immutable"}``), so it is stored as JSON with the job. Only single
signatures are supported: chains (``|``), groups, chords, chunks and maps raise
``NotImplementedError`` naming the canvas feature.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _state

if TYPE_CHECKING:
    from .app.base import Celery
    from .app.task import Task
    from .result import AsyncResult

__all__ = ["Signature", "chain", "chord", "chunks", "group", "maybe_signature", "signature",
           "subtask", "xmap", "xstarmap"]


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(
        f"canvas: {feature} is not supported by akadze_compat (only single signatures are: "
        "task.s(...), task.signature(...), add_periodic_task, link=). Call the next task "
        "from the task body instead, or enqueue it in the body's transaction with "
        "akadze_core's complete_tx for a step that must follow the previous one's commit.")


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a broken __repr__ must not break naming the entry
        return f"<unrepresentable {type(value).__name__}: {exc!r}>"


def reprcall(name: str, args: Any = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """``name(1, 2, x=3)``: how Celery writes a call (the default periodic task name)."""
    parts = [_safe_repr(arg) for arg in args or ()]
    parts += [f"{key}={_safe_repr(value)}" for key, value in (kwargs or {}).items()]
    return f"{name}({', '.join(parts)})"


def _item(key: str, doc: str) -> Any:
    """A property reading and writing ``self[key]`` (Celery's ``getitem_property``)."""

    def get(self: Signature) -> Any:
        return self.get(key)

    def set_(self: Signature, value: Any) -> None:
        self[key] = value

    return property(get, set_, doc=doc)


class Signature(dict):  # type: ignore[type-arg]  # a plain dict, as Celery's
    """One task call: task name, args, kwargs and execution options.

    ``Signature(task, args=None, kwargs=None, options=None, subtask_type=None,
    immutable=False, app=None, **options)``; ``task`` is a task or its name, or a dict
    (another signature's data), whose values are then used as they are.
    """

    _app: Celery | None = None
    _type: Task | None = None

    task = _item("task", "The task name.")
    args = _item("args", "Positional arguments (a tuple).")
    kwargs = _item("kwargs", "Keyword arguments.")
    options = _item("options", "Execution options for apply_async.")
    subtask_type = _item("subtask_type", "The signature type (None for a single task).")
    immutable = _item("immutable", "Whether partial arguments are ignored when called.")

    def __init__(self, task: Any = None, args: Any = None, kwargs: Any = None,
                 options: Mapping[str, Any] | None = None, type: Any = None,
                 subtask_type: str | None = None, immutable: bool = False,
                 app: Celery | None = None, **ex: Any) -> None:
        self._app = app
        if isinstance(task, dict):
            super().__init__(task)
            # A dict written by hand may leave keys out: Celery then fails later, on None.
            for key, default in (("args", ()), ("kwargs", {}), ("options", {}),
                                 ("immutable", False)):
                if self.get(key) is None:
                    self[key] = default
            self.setdefault("subtask_type", None)
            return
        name = getattr(task, "name", None)
        if name is not None and not isinstance(task, str):
            self._type = task
        else:
            name = task
        super().__init__(task=name, args=tuple(args or ()), kwargs=dict(kwargs or {}),
                         options=dict(options or {}, **ex), subtask_type=subtask_type,
                         immutable=immutable)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], app: Celery | None = None) -> Signature:
        """A signature from its dict form (as stored with a job)."""
        if data.get("subtask_type"):
            raise _unsupported(f"a {data['subtask_type']} signature")
        return cls(dict(data), app=app)

    # --- what it calls -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The task name (as ``Task.name``)."""
        return str(self["task"])

    @property
    def app(self) -> Celery:
        """The app it was made with, else the current app."""
        return self._app if self._app is not None else _state.get_current_app()

    @property
    def type(self) -> Task:
        """The task (looked up by name in the app when the signature was made from one)."""
        return self._type if self._type is not None else self.app.tasks[self.name]

    @property
    def id(self) -> str | None:
        """The task id chosen in the options (``task_id``), if any."""
        return self.options.get("task_id")

    def _merge(self, args: Any = None, kwargs: Any = None,
               options: Mapping[str, Any] | None = None, force: bool = False
               ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """Partial args go first, partial kwargs and options win; an immutable signature
        keeps its arguments unless ``force``."""
        merged_options = {**self.options, **(options or {})}
        if self.immutable and not force:
            return tuple(self.args), dict(self.kwargs), merged_options
        return ((*tuple(args or ()), *self.args), {**self.kwargs, **(kwargs or {})},
                merged_options)

    def __call__(self, *partial_args: Any, **partial_kwargs: Any) -> Any:
        """Call the task here, inline (like calling the task itself)."""
        args, kwargs, _ = self._merge(partial_args, partial_kwargs)
        return self.type(*args, **kwargs)

    def delay(self, *partial_args: Any, **partial_kwargs: Any) -> AsyncResult:
        """``apply_async(partial_args, partial_kwargs)``."""
        return self.apply_async(partial_args, partial_kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, route_name: str | None = None,
                    **options: Any) -> AsyncResult:
        """Enqueue the call, partial arguments and options merged in; a task this process
        does not know is sent by name."""
        options = {key: value for key, value in options.items() if value is not None}
        args, kwargs, options = self._merge(args, kwargs, options)
        if self._type is None and self.name not in self.app.tasks:
            return self.app.send_task(self.name, args, kwargs, route_name=route_name,
                                      **options)
        return self.type.apply_async(args, kwargs, **options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the call here, eagerly; returns an ``EagerResult``."""
        options = {key: value for key, value in options.items() if value is not None}
        args, kwargs, options = self._merge(args, kwargs, options)
        return self.type.apply(args, kwargs, **options)

    # --- copies and options --------------------------------------------------------------

    def clone(self, args: Any = None, kwargs: Any = None, **options: Any) -> Signature:
        """A copy with partial arguments and options merged in."""
        merged_args, merged_kwargs, merged_options = self._merge(args, kwargs, options)
        clone = Signature.from_dict({
            "task": self.task, "args": tuple(merged_args), "kwargs": dict(merged_kwargs),
            "options": copy.deepcopy(merged_options), "subtask_type": self.subtask_type,
            "immutable": self.immutable}, app=self._app)
        clone._type = self._type
        return clone

    partial = clone

    def replace(self, args: Any = None, kwargs: Any = None,
                options: Mapping[str, Any] | None = None) -> Signature:
        """A copy with args, kwargs or options replaced (those given)."""
        clone = self.clone()
        if args is not None:
            clone.args = tuple(args)
        if kwargs is not None:
            clone.kwargs = dict(kwargs)
        if options is not None:
            clone.options = dict(options)
        return clone

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        """Set execution options in place; returns the signature (for chaining calls)."""
        if immutable is not None:
            self.immutable = immutable
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        """Make partial arguments ignored (or not) when called."""
        self.immutable = immutable

    def link(self, callback: Any) -> Any:
        """Add ``callback`` to the ``link`` option (stored with the job, not run)."""
        self.options.setdefault("link", []).append(callback)
        return callback

    def link_error(self, errback: Any) -> Any:
        """Add ``errback`` to the ``link_error`` option (stored with the job, not run)."""
        self.options.setdefault("link_error", []).append(errback)
        return errback

    def on_error(self, errback: Any) -> Signature:
        """``link_error(errback)``, returning the signature."""
        self.link_error(errback)
        return self

    # --- representations -----------------------------------------------------------------

    def reprcall(self, *args: Any, **kwargs: Any) -> str:
        """``add(2, 2)``: the call as text, partial arguments merged in."""
        merged_args, merged_kwargs, _ = self._merge(args, kwargs, force=True)
        return reprcall(self.name, merged_args, merged_kwargs)

    def __repr__(self) -> str:
        return self.reprcall()

    def __deepcopy__(self, memo: dict[int, Any]) -> Signature:
        clone = Signature(dict(self), app=self._app)
        clone["options"] = copy.deepcopy(self.options, memo)
        clone._type = self._type
        memo[id(self)] = clone
        return clone

    def __reduce__(self) -> tuple[Any, ...]:
        return signature, (dict(self),)

    def __json__(self) -> dict[str, Any]:
        return dict(self)

    # --- canvas: not supported ---------------------------------------------------------------

    def __or__(self, other: Any) -> Any:
        if isinstance(other, Signature):
            raise _unsupported("chaining signatures with | (chain)")
        return NotImplemented

    def __ror__(self, other: Any) -> Any:
        if isinstance(other, Signature):
            raise _unsupported("chaining signatures with | (chain)")
        return NotImplemented

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc, override]
        return self.__or__(other)


def signature(varies: Any, *args: Any, **kwargs: Any) -> Signature:
    """A signature: a copy of a signature, one from a dict, or ``Signature(task, ...)``."""
    if isinstance(varies, Signature):
        return varies.clone()
    if isinstance(varies, dict):
        return Signature.from_dict(varies, app=kwargs.get("app"))
    return Signature(varies, *args, **kwargs)


subtask = signature


def maybe_signature(d: Any, app: Celery | None = None, clone: bool = False) -> Any:
    """``d`` as a signature (a dict is converted), or None for None."""
    if d is None:
        return None
    if isinstance(d, Signature):
        d = d.clone() if clone else d
    elif isinstance(d, dict):
        d = signature(d)
    if app is not None:
        d._app = app
    return d


class _Unsupported(Signature):
    """Base of the canvas primitives this facade does not provide."""

    feature = "this canvas primitive"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _unsupported(self.feature)


class chain(_Unsupported):
    """Celery's ``chain``: not supported."""

    feature = "chain"


class group(_Unsupported):
    """Celery's ``group``: not supported."""

    feature = "group"


class chord(_Unsupported):
    """Celery's ``chord``: not supported."""

    feature = "chord"


class chunks(_Unsupported):
    """Celery's ``chunks``: not supported."""

    feature = "chunks"


class xmap(_Unsupported):
    """Celery's ``xmap`` (``task.map``): not supported."""

    feature = "xmap"


class xstarmap(_Unsupported):
    """Celery's ``xstarmap`` (``task.starmap``): not supported."""

    feature = "xstarmap"
