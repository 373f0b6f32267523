"""``Signature``: one task call kept as data (Celery's ``celery.canvas.Signature``).

A signature is a dict, as in Celery (``{"task", "args", "kwargs", "options",
"subtask_type", "immutable"}``), so it is stored as JSON with a job and rebuilt from it:
``Signature.from_dict`` picks the class registered for its ``subtask_type`` (chain, group,
chord...). Sending one goes through its task's ``apply_async``; the canvas primitives
(``canvas.primitives``) send every task call of theirs as one node of one akadze_core
workflow, each added by ``to_flow``.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Mapping, MutableSequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .. import _state
from ..utils import uuid

if TYPE_CHECKING:
    from akadze_core import Workflow

    from ..app.base import Celery
    from ..app.task import Task
    from ..result import AsyncResult

__all__ = ["FlowBuilder", "Planned", "Signature", "maybe_signature", "reprcall",
           "signature", "subtask"]


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


def _option(key: str, doc: str) -> Any:
    """A property reading and writing ``self.options[key]`` (``options.task_id``...)."""

    def get(self: Signature) -> Any:
        return self.options.get(key)

    def set_(self: Signature, value: Any) -> None:
        self.options[key] = value

    return property(get, set_, doc=doc)


def listed(value: Any) -> list[Any]:
    """A callbacks option as a list (Celery keeps one signature or several)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class FlowBuilder(Protocol):
    """What a signature adds its task calls to when it is sent (``app.flow.Builder``)."""

    app: Celery
    #: The core workflow the calls go to (``Workflow.mark_inputs`` for a group's).
    workflow: Workflow

    def add_task(self, sig: Signature, *, after: list[Any], many: bool,
                 failure: str) -> tuple[Any, AsyncResult]:
        """Add one task call (a frozen, cloned single signature); returns its node and
        result."""

    def member_adder(self, options: dict[str, Any], *, after: list[Any], many: bool,
                     failure: str) -> MemberAdding:
        """What adds a group's members of plain task signatures as ``Signature.to_flow``
        with the group's ``options`` and the member's index would."""


class MemberAdding(Protocol):
    """Adds a group's plain members (``app.flow.MemberAdder``): those it ``take``s, in runs
    (``add``); any other member goes through ``to_flow``."""

    def take(self, member: Signature) -> Any:
        """What ``add`` needs to add ``member`` with, or None when it cannot."""

    def take_all(self, members: list[Any]) -> Any:
        """What ``take`` gives for each of ``members`` when it gives the same for all,
        told without asking member by member; else None."""

    def add(self, runs: list[tuple[Any, int, list[Signature]]], args: Any,
            kwargs: Any) -> tuple[list[Any], list[AsyncResult]]:
        """Add runs of members (what ``take`` gave for each member of the run, the index
        of its first member in the group, its members) with the group's partial
        ``args``/``kwargs``; their nodes and their results, in order (some of them not
        made yet: see ``place``)."""

    def place(self, results: list[Any]) -> None:
        """Say where the results ``add`` gave are kept (the group's result list, in its
        order): those not made yet are made there while the insert runs."""


@dataclass
class Planned:
    """What adding part of a canvas to a workflow gave: the nodes whose results the next
    step takes (``tails``; as a list when ``many``), the part's result, and the first
    result of its parent chain (whose ``parent`` the step before it becomes). A group's
    ``lists``: the spans of ``tails`` (start, stop) that are one member's tails, that
    member's value being their list (a chain ending in a group), which a chord's body
    takes as one value."""

    tails: list[Any]
    many: bool
    result: Any
    root: Any = field(default=None)
    lists: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.root is None:
            self.root = self.result


class Signature(dict):  # type: ignore[type-arg]  # a plain dict, as Celery's
    """One task call: task name, args, kwargs and execution options.

    ``Signature(task, args=None, kwargs=None, options=None, subtask_type=None,
    immutable=False, app=None, **options)``; ``task`` is a task or its name, or a dict
    (another signature's data), whose values are then used as they are.
    """

    #: ``subtask_type`` -> the class that rebuilds it (``register_type``).
    TYPES: ClassVar[dict[str, type[Signature]]] = {}
    #: Options merging never changes once set (Celery's: a group member's group id).
    IMMUTABLE_OPTIONS: ClassVar[frozenset[str]] = frozenset({"group_id", "stamped_headers"})

    _app: Celery | None = None
    _type: Task | None = None

    task = _item("task", "The task name.")
    args = _item("args", "Positional arguments (a tuple).")
    kwargs = _item("kwargs", "Keyword arguments.")
    options = _item("options", "Execution options for apply_async.")
    subtask_type = _item("subtask_type", "The signature type (None for a single task).")
    immutable = _item("immutable", "Whether partial arguments are ignored when called.")
    id = _option("task_id", "The task id (set by freeze, or chosen with set(task_id=...)).")
    parent_id = _option("parent_id", "The parent task's id.")
    root_id = _option("root_id", "The root task's id.")

    @classmethod
    def register_type(cls, name: str | None = None) -> Callable[[type[Signature]],
                                                                 type[Signature]]:
        """Class decorator: rebuild dicts whose ``subtask_type`` is ``name`` (default: the
        class name) with this class."""

        def register(subclass: type[Signature]) -> type[Signature]:
            cls.TYPES[name or subclass.__name__] = subclass
            return subclass

        return register

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
        """A signature from its dict form (as stored with a job): a chain, group, chord...
        for a dict of that ``subtask_type``."""
        kind = data.get("subtask_type")
        if kind:
            target = cls.TYPES.get(kind)
            if target is None:
                raise ValueError(f"unknown signature type {kind!r}")
            if target is not cls:
                return target.from_dict(data, app=app)
        return Signature(dict(data), app=app)

    # --- what it calls -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The task name (as ``Task.name``)."""
        return str(self["task"])

    @property
    def app(self) -> Celery:
        """The app it was made with, else (a canvas) its first task's, else the current
        app."""
        if self._app is not None:
            return self._app
        return self._fallback_app() or _state.get_current_app()

    @app.setter
    def app(self, app: Celery | None) -> None:
        self._app = app

    def _fallback_app(self) -> Celery | None:
        """The app when none was given (a canvas takes its tasks')."""
        return None

    @property
    def type(self) -> Task:
        """The task (looked up by name in the app when the signature was made from one)."""
        return self._type if self._type is not None else self.app.tasks[self.name]

    @property
    def known_type(self) -> Task | None:
        """The task, or None when this process does not know it (sent by name)."""
        if self._type is not None:
            return self._type
        return self.app.registry.get(self.name)

    @property
    def AsyncResult(self) -> Callable[..., AsyncResult]:
        """The result class for this task's calls (the task's, else the app's)."""
        task = self.known_type
        return task.AsyncResult if task is not None else self.app.AsyncResult

    def _merge(self, args: Any = None, kwargs: Any = None,
               options: Mapping[str, Any] | None = None, force: bool = False
               ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """Partial args go first, partial kwargs and options win (but an option of
        ``IMMUTABLE_OPTIONS`` already set); an immutable signature keeps its arguments
        unless ``force``."""
        if options:
            merged_options = {**self.options, **{
                key: value for key, value in options.items()
                if key not in self.IMMUTABLE_OPTIONS or key not in self.options}}
        else:
            merged_options = dict(self.options)
        if self.immutable and not force:
            return tuple(self.args), dict(self.kwargs), merged_options
        return ((*tuple(args or ()), *self.args), {**self.kwargs, **(kwargs or {})},
                merged_options)

    def __call__(self, *partial_args: Any, **partial_kwargs: Any) -> Any:
        """Call the task here, inline (like calling the task itself)."""
        args, kwargs, _ = self._merge(partial_args, partial_kwargs)
        return self.type(*args, **kwargs)

    def delay(self, *partial_args: Any, **partial_kwargs: Any) -> Any:
        """``apply_async(partial_args, partial_kwargs)``."""
        return self.apply_async(partial_args, partial_kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, route_name: str | None = None,
                    **options: Any) -> Any:
        """Enqueue the call, partial arguments and options merged in; a task this process
        does not know is sent by name. ``link``/``link_error`` in the options are run by
        the database: callbacks wait for this job, errbacks are inserted when it fails."""
        options = {key: value for key, value in options.items() if value is not None}
        args, kwargs, options = self._merge(args, kwargs, options)
        if self.known_type is None:
            return self.app.send_task(self.name, args, kwargs, route_name=route_name,
                                      **options)
        return self.type.apply_async(args, kwargs, **options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the call here, eagerly; returns an ``EagerResult``."""
        options = {key: value for key, value in options.items() if value is not None}
        args, kwargs, options = self._merge(args, kwargs, options)
        return self.type.apply(args, kwargs, **options)

    def __invert__(self) -> Any:
        """``~sig``: send it and wait for its result."""
        return self.apply_async().get()

    # --- copies and options --------------------------------------------------------------

    def clone(self, args: Any = None, kwargs: Any = None, **options: Any) -> Signature:
        """A copy with partial arguments and options merged in (the options deep-copied,
        so callbacks added to the copy do not change this one)."""
        merged_args, merged_kwargs, merged_options = self._merge(args, kwargs, options)
        clone = Signature.from_dict({
            "task": self.task, "args": tuple(merged_args), "kwargs": dict(merged_kwargs),
            "options": copy.deepcopy(merged_options), "subtask_type": self.subtask_type,
            "immutable": self.immutable}, app=self._app)
        clone._type = self._type
        return clone

    partial = clone

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Any = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give the call its task id now (kept if it has one; ``_id`` or a new uuid4) and
        return its result; sending it later uses that id."""
        options = self.options
        task_id = options.get("task_id")
        if task_id is None:
            task_id = options["task_id"] = _id or uuid()
        if root_id:
            options["root_id"] = root_id
        if parent_id:
            options["parent_id"] = parent_id
        if group_id and "group_id" not in options:
            options["group_id"] = group_id
        if chord:
            options["chord"] = chord
        if group_index is not None:
            options["group_index"] = group_index
        return self.AsyncResult(task_id)

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
            self.set_immutable(immutable)
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        """Make partial arguments ignored (or not) when called."""
        self.immutable = immutable

    def _list_option(self, key: str) -> list[Any]:
        items = self.options.setdefault(key, [])
        if not isinstance(items, MutableSequence):
            items = self.options[key] = [items]
        return items  # type: ignore[no-any-return]

    def append_to_list_option(self, key: str, value: Any) -> Any:
        """Add ``value`` to the list option ``key`` unless it is there already."""
        items = self._list_option(key)
        if value not in items:
            items.append(value)
        return value

    def extend_list_option(self, key: str, value: Any) -> None:
        """Add the values (one or a list) to the list option ``key``."""
        self._list_option(key).extend(listed(value))

    def link(self, callback: Any) -> Any:
        """Run ``callback`` with this call's result when it succeeds; returns ``callback``."""
        return self.append_to_list_option("link", callback)

    def link_error(self, errback: Any) -> Any:
        """Run ``errback`` when this call fails; returns ``errback``."""
        return self.append_to_list_option("link_error", errback)

    def on_error(self, errback: Any) -> Signature:
        """``link_error(errback)``, returning the signature (``sig.on_error(e).delay()``)."""
        self.link_error(errback)
        return self

    def flatten_links(self) -> list[Signature]:
        """This signature and, recursively, its ``link`` callbacks."""
        return list(itertools.chain([self], *(
            maybe_signature(link).flatten_links() for link in listed(self.options.get("link")))))

    # --- sending: one node of a workflow -------------------------------------------------

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Mapping[str, Any] | None = None) -> Planned:
        """Add this call to ``builder``'s workflow after the nodes ``after`` (whose result,
        or list of results when ``many``, is prepended to its args when it runs, unless
        it is immutable); ``failure`` is what it becomes when an upstream fails
        (``"cancel"``, or ``"fail"`` for a chord body)."""
        sig = self.clone(args, kwargs, **dict(options or {}))
        sig.freeze()
        node, result = builder.add_task(sig, after=after, many=many, failure=failure)
        return Planned([node], False, result)

    def count_tasks(self) -> int:
        """How many results this part gives its chord (Celery's ``_descend``): 1."""
        return 1

    # --- composing -----------------------------------------------------------------------

    def __or__(self, other: Any) -> Any:
        chain_type: Any = self.TYPES["chain"]
        group_type: Any = self.TYPES["group"]
        if isinstance(other, chain_type):
            return chain_type(self, *other.unchain_tasks(), app=self._app)
        if isinstance(other, group_type):
            return chain_type(self, maybe_unroll_group(other), app=self._app)
        if isinstance(other, Signature):
            return chain_type(self, other, app=self._app)
        return NotImplemented

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc, override]
        # dict's |= merges; a signature chains, as in Celery.
        return self.__or__(other)

    # --- representations -----------------------------------------------------------------

    def reprcall(self, *args: Any, **kwargs: Any) -> str:
        """``add(2, 2)``: the call as text, partial arguments merged in."""
        merged_args, merged_kwargs, _ = self._merge(args, kwargs, force=True)
        return reprcall(self.name, merged_args, merged_kwargs)

    def __repr__(self) -> str:
        return self.reprcall()

    def __deepcopy__(self, memo: dict[int, Any]) -> Signature:
        clone = type(self).from_dict(copy.deepcopy(dict(self), memo), app=self._app)
        clone._type = self._type
        memo[id(self)] = clone
        return clone

    def __reduce__(self) -> tuple[Any, ...]:
        return signature, (dict(self),)

    def __json__(self) -> dict[str, Any]:
        return dict(self)


def alike_plain(members: list[Any]) -> bool:
    """Whether ``members`` are plain task signatures (``Signature`` itself, no options) of
    one task name, task, app and immutability: what ``group(task.s(i) for i in ...)``
    holds. Told in C-level passes over the list, not a Python step per member (a 10,000-
    member group's classifying member by member was an eighth of its send)."""
    if not members or set(map(type, members)) != {Signature}:
        return False
    get = dict.get
    if any(map(get, members, itertools.repeat("options"))):
        return False
    return all(len(set(values)) == 1 for values in (
        map(get, members, itertools.repeat("task")),
        map(id, map(operator.attrgetter("_type"), members)),
        map(id, map(operator.attrgetter("_app"), members)),
        map(bool, map(get, members, itertools.repeat("immutable")))))


def maybe_unroll_group(group: Any) -> Any:
    """A group of one task is that task (Celery unrolls them when chaining)."""
    tasks = group.tasks
    if isinstance(tasks, (list, tuple)) and len(tasks) == 1:
        return maybe_signature(tasks[0], app=group._app).clone()
    return group


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
        d = signature(d, app=app)
    if app is not None:
        d._app = app
    return d
