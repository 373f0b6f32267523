"""Celery's canvas primitives: ``chain``, ``group`` and ``chord`` (``chunks`` and the maps
are in ``canvas.maps``), composed as Celery composes them (``group | task`` is a chord, a chain of a
chain is spliced, a group of one task is that task...).

Sending one builds one akadze_core workflow (``app.flow``): every task call in it is a
node inserted by the same statement, a chain step waits for the step before it, a chord
body for the header's members, and the database releases each when its upstreams succeed,
in the transaction that writes their outcome. With ``task_always_eager`` the canvas runs
here, inline, as Celery runs it (``apply``).
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ..app import flow
from ..backends.base import GROUP_BODY
from ..result import GroupResult, allow_join_result
from ..utils import uuid
from .signatures import (
    FlowBuilder,
    Planned,
    Signature,
    listed,
    maybe_signature,
    maybe_unroll_group,
    signature,
)

__all__ = ["chain", "chord", "group"]

#: Options a step of a chain never takes from the chain (they name the chain's tail).
_TAIL_OPTIONS = ("task_id", "group_id", "group_index")


def remove_repeating(task_name: str, text: str) -> str:
    """``proj.add(1) | proj.mul(2)`` -> ``proj.add(1) | mul(2)``: the module written once,
    as Celery writes canvases."""
    module = str(task_name).rpartition(".")[0] + "."
    index = text.find(module)
    if index < 0 or module == ".":
        return text
    cut = index + len(module)
    return text[:cut] + text[cut:].replace(module, "")


def _signatures(tasks: Iterable[Any], app: Any) -> list[Signature]:
    return [maybe_signature(task, app=app) for task in tasks]


def _eager(app: Any) -> bool:
    return bool(app.conf["task_always_eager"])


@Signature.register_type(name="chain")
class _chain(Signature):
    """A chain as built by ``|`` (Celery's ``_chain``); ``chain(...)`` makes one."""

    tasks = property(lambda self: self.kwargs["tasks"],
                     lambda self, value: self.kwargs.__setitem__("tasks", value),
                     doc="The steps, in order.")

    @classmethod
    def from_dict(cls, data: Any, app: Any = None) -> Signature:
        """A chain from its dict form (its steps rebuilt)."""
        tasks = _signatures(data["kwargs"]["tasks"] or (), app)
        return _chain(*tasks, app=app, **dict(data.get("options") or {}))

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], dict) \
                and isinstance(tasks[0], Iterable):
            tasks = tuple(tasks[0])
        app = options.pop("app", None)
        super().__init__("celery.chain", (), {"tasks": list(tasks)}, app=app, **options)
        self.subtask_type = "chain"

    def _fallback_app(self) -> Any:
        """A chain without an app takes its first step's."""
        return maybe_signature(self.tasks[0]).app if self.tasks else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.tasks:
            return self.apply_async(args, kwargs)
        return None

    def clone(self, args: Any = None, kwargs: Any = None, **options: Any) -> Signature:
        """A copy with copies of the steps."""
        clone = super().clone(args, kwargs, **options)
        clone.kwargs["tasks"] = [maybe_signature(task, app=self._app, clone=True)
                                 for task in clone.kwargs["tasks"]]
        return clone

    def unchain_tasks(self) -> list[Signature]:
        """Copies of the steps, the chain's ``link`` added to the last and its
        ``link_error`` to each (as Celery does when splicing a chain)."""
        tasks = [maybe_signature(task, app=self._app).clone() for task in self.tasks]
        if tasks:
            for callback in listed(self.options.get("link")):
                tasks[-1].link(callback)
            for errback in listed(self.options.get("link_error")):
                for task in tasks:
                    task.link_error(errback)
        return tasks

    def __or__(self, other: Any) -> Any:
        if isinstance(other, group):
            other = maybe_unroll_group(other)
            if not isinstance(other, group):
                return self.__or__(other)
            tasks: list[Any] = self.unchain_tasks()
            if not tasks:
                return other
            if isinstance(tasks[-1], _chord):
                tasks[-1].body = tasks[-1].body | other
                return type(self)(tasks, app=self._app)
            return type(self)(*tasks, other, app=self._app)
        if isinstance(other, _chain):
            return functools.reduce(operator.or_, other.unchain_tasks(), self)
        if isinstance(other, Signature):
            if self.tasks and isinstance(self.tasks[-1], group):
                # A chain ending in a group, then a task: the group becomes a chord.
                sig: Any = self.clone()
                sig.tasks[-1] = _chord(sig.tasks[-1], other, app=self._app)
                if len(sig.tasks) > 1 and isinstance(sig.tasks[-2], _chord):
                    sig.tasks[-2].body = sig.tasks[-2].body | sig.tasks[-1]
                    sig.tasks = sig.tasks[:-1]
                return sig
            if self.tasks and isinstance(self.tasks[-1], _chord) \
                    and not isinstance(other, _chord):
                sig = self.clone()
                sig.tasks[-1].body = sig.tasks[-1].body | other
                return sig
            return type(self)(*self.unchain_tasks(), other, app=self._app)
        return NotImplemented

    def steps(self) -> list[Signature]:
        """The steps as they run: nested chains spliced, empty groups dropped, groups of
        one task unrolled, and a group followed by a step made a chord of the two (Celery's
        ``prepare_steps``)."""
        pending = deque(maybe_signature(task, app=self._app) for task in self.tasks)
        flat: list[Signature] = []
        while pending:
            task = pending.popleft()
            if isinstance(task, _chain):
                pending.extendleft(reversed(task.unchain_tasks()))
                continue
            if isinstance(task, group):
                task = maybe_unroll_group(task)
                if isinstance(task, group) and isinstance(task.tasks, (list, tuple)) \
                        and not task.tasks and (flat or pending):
                    continue
            flat.append(task)
        upgraded: list[Signature] = []
        for task in reversed(flat):
            if isinstance(task, group) and upgraded:
                task = _chord(task, upgraded.pop(), app=self._app)
            upgraded.append(task)
        return upgraded[::-1]

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Any = None) -> Planned:
        """Each step after the one before it; the partial arguments go to the first step,
        as do the options but ``task_id`` (the last step's id, as its group id and index
        when the chain is a group member) and ``link_error`` (every step's)."""
        options = {**self.options, **dict(options or {})}
        if not self.immutable:
            args = (*tuple(args or ()), *self.args)
        else:
            args, kwargs = self.args, {}
        tail = {key: options.pop(key) for key in _TAIL_OPTIONS if key in options}
        link = listed(options.pop("link", None))
        errbacks = listed(options.pop("link_error", None))
        steps = [step.clone() for step in self.steps()]
        if not steps:
            raise ValueError("an empty chain has nothing to send")
        for step in steps:
            for errback in errbacks:
                step.link_error(errback)
        for callback in link:
            steps[-1].link(callback)
        planned: Planned | None = None
        for index, step in enumerate(steps):
            step_options = dict(options) if index == 0 else {}
            if index == len(steps) - 1:
                step_options.update(tail)
            if planned is None:
                part = step.to_flow(builder, args, kwargs, after=after, many=many,
                                    failure=failure, options=step_options)
            else:
                part = step.to_flow(builder, after=planned.tails, many=planned.many,
                                    failure="cancel", options=step_options)
                if part.root is not None and part.root.parent is None:
                    part.root.parent = planned.result
            first = planned.root if planned is not None else part.root
            planned = Planned(part.tails, part.many, part.result, first)
        assert planned is not None
        return planned

    def count_tasks(self) -> int:
        """A chain gives its chord the results of its last step."""
        for step in reversed(self.steps()):
            count = step.count_tasks()
            if count:
                return count
        return 0

    def apply_async(self, args: Any = None, kwargs: Any = None,  # type: ignore[override]
                    **options: Any) -> Any:
        """Send every step (one workflow); returns the last step's result, whose
        ``parent`` is the step before it."""
        options = {key: value for key, value in options.items() if value is not None}
        if _eager(self.app):
            with allow_join_result():
                return self.apply(args, kwargs, **options)
        return flow.send_canvas(self.app, self, args, kwargs, options)

    def run(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """``apply_async`` (Celery's name for sending a chain)."""
        return self.apply_async(args, kwargs, **options)

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Any = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give every step its id now; returns the last step's result (parents linked)."""
        steps = self.steps()
        self.tasks = steps
        previous = None
        result = None
        for index, step in enumerate(steps):
            last = index == len(steps) - 1
            result = step.freeze(_id if last else None, root_id=root_id,
                                 group_id=group_id if last else None,
                                 group_index=group_index if last else None)
            node = result
            while node is not None and node.parent is not None:
                node = node.parent
            if node is not None and previous is not None and node is not previous:
                node.parent = previous
            previous = result
        if result is not None:
            self.options["task_id"] = result.id
        return result

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the steps here, one after the other, each given the previous result."""
        last = None
        options = {**self.options, **options}
        options.pop("task_id", None)
        link = options.pop("link", None)
        steps = self.steps()
        for index, step in enumerate(steps):
            # The chain's arguments go to the first step's apply (a chord's header takes
            # them there, not from a copy), then the previous result; get() raises a
            # failure there, as Celery's does.
            partial, partial_kwargs = (args, kwargs) if last is None else ((last.get(),), None)
            step_options = dict(options)
            if link is not None and index == len(steps) - 1:
                step_options["link"] = link
            result = step.apply(partial, partial_kwargs, **step_options)
            result.parent = last
            last = result
            if getattr(result, "state", None) in ("IGNORED", "REJECTED"):
                break
        return last

    def __repr__(self) -> str:
        if not self.tasks:
            return f"<{type(self).__name__}@{id(self):#x}: empty>"
        first = maybe_signature(self.tasks[0])
        return remove_repeating(first.name, " | ".join(repr(task) for task in self.tasks))


class chain(_chain):
    """Chain tasks: each one gets the previous one's result as its first argument.

    ``chain(a, b, c)`` is ``a | b | c`` (so ``chain(group, task)`` is a chord); one
    iterable argument (a generator) gives the steps.
    """

    def __new__(cls, *tasks: Any, **options: Any) -> Any:
        if not options and tasks and (len(tasks) != 1
                                      or isinstance(tasks[0], (list, tuple, Iterator))):
            steps = list(tasks[0] if len(tasks) == 1 else tasks)
            if all(type(step) is Signature for step in steps):
                # What folding with | gives for plain task signatures, each copied once:
                # the fold copies every earlier step at each |, quadratic in the length
                # (7 s for 1,000 steps).
                return _chain(*[step.clone() for step in steps])
            return functools.reduce(operator.or_, steps, _chain())
        return super().__new__(cls)


def _flatten_members(tasks: Iterable[Any], app: Any, copy: bool = True) -> list[Signature]:
    """A group's members, nested groups flattened, each a copy (unless ``copy`` is False:
    sending copies each member anyway)."""
    if not copy:
        listed = tasks if isinstance(tasks, (list, tuple)) else list(tasks)
        if set(map(type, listed)) <= {Signature}:  # in C: no Python step per member
            # Plain task signatures (the 10,000 of a big group): nothing nested nor to
            # convert, so no queue; maybe_signature's binding to the app is all there is.
            if app is not None:
                for task in listed:
                    task.app = app
            return list(listed)
        tasks = listed
    pending = deque(maybe_signature(task, app=app) for task in tasks)
    members: list[Signature] = []
    while pending:
        task = pending.popleft()
        if copy:
            task = task.clone()
        if isinstance(task, group):
            pending.extendleft(reversed([maybe_signature(t, app=app) for t in task.tasks]))
        elif not (isinstance(task, _chain) and not task.tasks):
            # An empty chain sends nothing and has no result: dropped, as Celery 5.7 drops
            # it (celery#9772; a header of nothing else runs the body at once with []).
            members.append(task)
    return members


@Signature.register_type()
class group(Signature):
    """Run tasks in parallel; ``group(...)()`` returns a ``GroupResult`` of their results
    in order. One iterable argument (a list, a generator) gives the tasks."""

    tasks = property(lambda self: self.kwargs["tasks"],
                     lambda self, value: self.kwargs.__setitem__("tasks", value),
                     doc="The tasks, in order.")

    @classmethod
    def from_dict(cls, data: Any, app: Any = None) -> Signature:
        """A group from its dict form (its tasks rebuilt)."""
        return group(_signatures(data["kwargs"]["tasks"], app), app=app,
                     **dict(data.get("options") or {}))

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if len(tasks) == 1:
            only = tasks[0]
            if isinstance(only, group):
                tasks = tuple(only.tasks)
            elif isinstance(only, Signature):
                tasks = (only.clone(),)
            elif isinstance(only, Iterable) and not isinstance(only, dict):
                tasks = tuple(only)
        app = options.pop("app", None)
        super().__init__("celery.group", (), {"tasks": list(tasks)}, app=app, **options)
        self.subtask_type = "group"

    def _fallback_app(self) -> Any:
        """A group without an app takes its first task's."""
        return maybe_signature(self.tasks[0]).app if self.tasks else None

    def __call__(self, *partial_args: Any, **options: Any) -> Any:
        return self.apply_async(partial_args, **options)

    def __or__(self, other: Any) -> Any:
        if isinstance(other, group) and isinstance(other.tasks, (list, tuple)) \
                and not other.tasks:
            return self
        return _chord(self, body=other, app=self._app)

    def __len__(self) -> int:
        return len(self.tasks)

    def clone(self, args: Any = None, kwargs: Any = None, **options: Any) -> Signature:
        """A copy with copies of the tasks."""
        clone = super().clone(args, kwargs, **options)
        clone.kwargs["tasks"] = [maybe_signature(task, app=self._app, clone=True)
                                 for task in clone.kwargs["tasks"]]
        return clone

    def link(self, callback: Any) -> Any:
        """Celery links a group's callback to its first task only, made immutable (it
        cannot take the other members' results): use a chord to wait for all."""
        callback = maybe_signature(callback).clone().set(immutable=True)
        return maybe_signature(self.tasks[0]).link(callback)

    def link_error(self, errback: Any) -> Any:
        """Add ``errback`` to every task (it may then run more than once)."""
        errback = maybe_signature(errback)
        return tuple(maybe_signature(task).link_error(errback.clone()) for task in self.tasks)

    def set_immutable(self, immutable: bool) -> None:
        """Make every task immutable (or not)."""
        for task in self.tasks:
            maybe_signature(task).set_immutable(immutable)

    def skew(self, start: float = 1.0, stop: float | None = None,
             step: float = 1.0) -> group:
        """Give the tasks countdowns ``start``, ``start + step``... (up to ``stop``)."""
        value = start
        for task in self.tasks:
            maybe_signature(task).set(countdown=value)
            if stop is None or value + step <= stop:
                value += step
        return self

    def _group_options(self, options: Any) -> tuple[dict[str, Any], str]:
        merged = {**self.options, **{
            key: value for key, value in dict(options or {}).items()
            if key not in self.IMMUTABLE_OPTIONS or key not in self.options}}
        group_id = merged.pop("task_id", None) or uuid()
        return merged, group_id

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Any = None) -> Planned:
        """Every member after the same upstreams, each with the group's options and its
        group id and index."""
        options, group_id = self._group_options(options)
        options.pop("group_id", None)
        options.pop("group_index", None)
        tails: list[Any] = []
        lists: list[tuple[int, int]] = []  # the tails of a member that gives a list
        results = []
        shared = {**options, "group_id": group_id}
        if failure == "fail":  # a chord's body: its members fail as Celery's do
            shared[GROUP_BODY] = True
        # The group's plain task signatures without building each one's copy (a 10,000-
        # member group's time went mostly there); any other member goes the full way.
        adder = builder.member_adder(shared, after=after, many=many, failure=failure)
        workflow = builder.workflow
        first = len(workflow)
        members = _flatten_members(self.tasks, self._app, copy=False)
        # Runs of plain members are added at once (encoded in bulk), in member order: one
        # run of all when they are alike, told without a step per member.
        row = adder.take_all(members)
        runs: list[tuple[Any, int, list[Signature]]] = []
        if row is not None:
            runs.append((row, 0, members))
            members = []

        def flush() -> None:
            nodes, added = adder.add(runs, args, kwargs)
            tails.extend(nodes)
            results.extend(added)
            runs.clear()

        for index, member in enumerate(members):
            row = adder.take(member)
            if row is not None:
                if runs and runs[-1][0] is row:
                    runs[-1][2].append(member)
                else:
                    runs.append((row, index, [member]))
                continue
            if runs:
                flush()
            part = member.to_flow(builder, args, kwargs, after=after, many=many,
                                  failure=failure, options={**shared, "group_index": index})
            if part.many:
                lists.append((len(tails), len(tails) + len(part.tails)))
            tails.extend(part.tails)
            results.append(part.result)
        if runs:
            flush()
        if after and len(workflow) > first:
            # Its members are a fan-in's inputs (a chord's header, closed by its body; a
            # member's list, by celery.accumulate), a chord's body, or a chain's last step.
            # A failure from before the group cancels the fan-in it opens without its
            # errbacks and leaves the members PENDING: Celery never sends them, and stores
            # the failure only in later steps (a chord's body); one of the members' own
            # fails it with ChordError.
            workflow.mark_inputs(workflow.nodes[first])
        result = GroupResult(group_id, results, app=builder.app)
        adder.place(result.results)
        return Planned(tails, True, result, lists=lists)

    def count_tasks(self) -> int:
        """Each member counts for the chord."""
        return sum(maybe_signature(task).count_tasks() for task in self.tasks)

    def apply_async(self, args: Any = None,  # type: ignore[override]  # Celery's
                    kwargs: Any = None, add_to_parent: bool = True,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    **options: Any) -> Any:
        """Send every task (one workflow); returns their ``GroupResult``."""
        if link is not None:
            raise TypeError("Cannot add link to group: use a chord")
        if link_error is not None:
            raise TypeError("Cannot add link to group: do that on individual tasks")
        options = {key: value for key, value in options.items() if value is not None}
        app = self.app
        if _eager(app):
            return self.apply(args, kwargs, **options)
        if not self.tasks:
            return self.freeze()
        result = flow.send_canvas(app, self, args, kwargs, options)
        if len(result) == 1 and isinstance(result[0], GroupResult):
            return result[0]
        return result

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Any = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give the group and every task its id now; returns the ``GroupResult``."""
        options = self.options
        gid = options.get("task_id")
        if gid is None:
            gid = options["task_id"] = group_id or _id or uuid()
        members = _flatten_members(self.tasks, self._app)
        results = [member.freeze(group_id=gid, root_id=root_id, parent_id=parent_id,
                                 group_index=index) for index, member in enumerate(members)]
        self.tasks = members
        return GroupResult(gid, results, app=self.app)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run every task here; returns a ``GroupResult`` of their ``EagerResult``."""
        if not self.tasks:
            return self.freeze()
        options, group_id = self._group_options(options)
        results = []
        for index, member in enumerate(_flatten_members(self.tasks, self._app)):
            member.options.setdefault("group_id", group_id)
            member.options.setdefault("group_index", index)
            results.append(member.apply(args, kwargs, **options))
        return GroupResult(group_id, results, app=self.app)

    def __repr__(self) -> str:
        if self.tasks:
            first = maybe_signature(self.tasks[0])
            return remove_repeating(first.name, f"group({tuple(self.tasks)!r})")
        return "group(<empty>)"


@Signature.register_type(name="chord")
class _chord(Signature):
    """A group and a body called with the list of the group's results, once every member
    succeeded. ``chord(header, body)``, or ``chord(header)(body)``."""

    tasks = property(lambda self: self.kwargs["header"],
                     lambda self, value: self.kwargs.__setitem__("header", value),
                     doc="The header (a group, or its tasks).")
    body = property(lambda self: self.kwargs["body"],
                    lambda self, value: self.kwargs.__setitem__("body", value),
                    doc="The body, called with the header's results.")

    @classmethod
    def from_dict(cls, data: Any, app: Any = None) -> Signature:
        """A chord from its dict form (header and body rebuilt)."""
        kwargs = dict(data["kwargs"])
        header, body = kwargs.pop("header", None), kwargs.pop("body", None)
        return _chord(header, body, app=app, args=data.get("args"),
                      kwargs=kwargs, **dict(data.get("options") or {}))

    def __init__(self, header: Any, body: Any = None, task: str = "celery.chord",
                 args: Any = None, kwargs: Any = None, app: Any = None,
                 **options: Any) -> None:
        kwargs = dict(kwargs) if kwargs else {"kwargs": {}}
        super().__init__(task, args or (), {**kwargs, "header": _header_tasks(header, app),
                                            "body": maybe_signature(body, app=app)},
                         app=app, **options)
        self.subtask_type = "chord"

    def _header(self) -> group:
        """The header as a group, with the id ``freeze`` gave it, if it was frozen."""
        header = group(self.tasks, app=self._app)
        header_id = getattr(self, "_header_id", None) or _frozen_group_id(self.tasks)
        if header_id is not None:
            header.options["task_id"] = header_id
        return header

    def _fallback_app(self) -> Any:
        """A chord without an app takes its header's first task's, else its body's."""
        for candidate in (*self.tasks[:1], self.body):
            if candidate is not None:
                return maybe_signature(candidate).app
        return None

    def __call__(self, body: Any = None, **options: Any) -> Any:
        return self.apply_async((), {"body": body} if body else {}, **options)

    def __or__(self, other: Any) -> Any:
        if not isinstance(other, (group, _chain)) and isinstance(other, Signature):
            sig: Any = self.clone()
            sig.body = sig.body | other
            return sig
        if isinstance(other, group) and len(other.tasks) == 1:
            sig = self.clone()
            sig.body = sig.body | maybe_unroll_group(other)
            return sig
        return super().__or__(other)

    def __length_hint__(self) -> int:
        return sum(maybe_signature(task).count_tasks() for task in self.tasks)

    def clone(self, args: Any = None, kwargs: Any = None, **options: Any) -> Signature:
        """A copy with copies of the header and body."""
        clone = super().clone(args, kwargs, **options)
        clone.kwargs["header"] = [maybe_signature(task, app=self._app, clone=True)
                                  for task in clone.kwargs["header"]]
        if clone.kwargs.get("body") is not None:
            clone.kwargs["body"] = maybe_signature(clone.kwargs["body"], clone=True)
        return clone

    def link(self, callback: Any) -> Any:
        """Link ``callback`` to the body."""
        self.body.link(callback)
        return callback

    def link_error(self, errback: Any) -> Any:
        """Link ``errback`` to the body (it gets the ``ChordError`` of a failed member),
        and to each header task too with ``task_allow_error_cb_on_chord_header``.

        Without that setting Celery links it to the chords nested in the header as well,
        yet calls it once when one of them fails (its t/integration
        test_nested_chord_header_link_error): on Redis the outer chord never completes
        then. Here the outer body always fails when a member does, so the body's errback
        alone runs it, once."""
        errback = maybe_signature(errback)
        if self.app.conf.get("task_allow_error_cb_on_chord_header"):
            for task in self.tasks:
                maybe_signature(task).link_error(errback.clone(immutable=True))
        self.body.link_error(errback)
        return errback

    def set_immutable(self, immutable: bool) -> None:
        """Make the header's tasks immutable (or not); the body is left as it is."""
        for task in self.tasks:
            maybe_signature(task).set_immutable(immutable)

    def count_tasks(self) -> int:
        """A chord gives its parent chord its body's results."""
        return self.body.count_tasks() if self.body is not None else 0

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Any = None) -> Planned:
        """The header as a group, then the body after every header member with the list
        of their results; the body fails (``ChordError``) when a member fails."""
        options = {**self.options, **dict(options or {})}
        body_options = {key: options.pop(key) for key in _TAIL_OPTIONS if key in options}
        # link=/link_error= given to the chord are added to the body's own callbacks, as
        # Celery 5.7 adds them (cloning the body with them replaced its own).
        callbacks: dict[str, Any] = {key: options.pop(key) for key in ("link", "link_error")
                                     if key in options}
        body = _with_callbacks(self.body.clone(**options), callbacks)
        body.options.update(body_options)
        for key in ("chain", "chord"):
            options.pop(key, None)
        header = self._header()  # a group: it marks its inputs (group.to_flow)
        header_part = header.to_flow(builder, args, kwargs, after=after, many=many,
                                     failure=failure, options=options)
        if header_part.tails:
            body_part = body.to_flow(builder, after=_member_values(builder, header_part),
                                     many=True, failure="fail")
        else:  # an empty header: the body is called with [] (Celery's body.delay([]))
            body_part = body.to_flow(builder, ([],), after=after, many=many, failure=failure)
        node = body_part.root
        if node is not None and node.parent is None:
            node.parent = header_part.result
        return Planned(body_part.tails, body_part.many, body_part.result, header_part.result)

    def apply_async(self, args: Any = None,  # type: ignore[override]  # Celery's
                    kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, publisher: Any = None, connection: Any = None,
                    router: Any = None, result_cls: Any = None, **options: Any) -> Any:
        """Send header and body (one workflow); returns the body's result, whose
        ``parent`` is the header's ``GroupResult``."""
        kwargs = dict(kwargs or {})
        body = kwargs.pop("body", None) or self.body
        sig: Any = self if body is self.body else self.clone()
        sig.body = maybe_signature(body, app=self._app)
        options = {key: value for key, value in options.items() if value is not None}
        if task_id is not None:
            options["task_id"] = task_id
        if connection is not None:
            options["connection"] = connection
        app = sig.app
        if _eager(app):
            callbacks: dict[str, Any] = {key: options.pop(key) for key in ("link", "link_error")
                                         if key in options}
            with allow_join_result():
                return sig.apply(args, kwargs, body=_with_callbacks(sig.body.clone(), callbacks),
                                 **options)
        return flow.send_canvas(app, sig, args, kwargs, options)

    def apply(self, args: Any = None, kwargs: Any = None, propagate: bool = True,
              body: Any = None, **options: Any) -> Any:
        """Run the header here, then the body with the list of its results."""
        body = self.body if body is None else maybe_signature(body)
        header = group(self.tasks, app=self._app)
        values = header.apply(args, kwargs).get(propagate=propagate)
        options.pop("task_id", None)
        return body.apply(args=(values,), **options)

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Any = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give header and body their ids now; returns the body's result. The header's
        group id is kept (as Celery keeps the header group): sending the chord later, or
        freezing it again, uses the same ids."""
        header = self._header()
        header_result = header.freeze(parent_id=parent_id, root_id=root_id)
        self.tasks = header.tasks
        self._header_id = header_result.id
        if self.body is None:
            return None
        body_result = self.body.freeze(_id, root_id=root_id, group_id=group_id,
                                       group_index=group_index)
        node = body_result
        while node is not None and node.parent is not None:
            node = node.parent
        if node is not None:
            node.parent = header_result
        return body_result

    def __repr__(self) -> str:
        if self.body is None:
            return f"<chord without body: {self.tasks!r}>"
        if isinstance(self.body, _chain):
            steps = self.body.tasks
            first = maybe_signature(steps[0])
            rest = _chain(*steps[1:], app=self._app)
            return remove_repeating(first.name,
                                    f"%({first.reprcall(self.tasks)} | {rest!r})")
        return "%" + remove_repeating(self.body.name, self.body.reprcall(self.tasks))


chord = _chord


def _member_values(builder: FlowBuilder, header: Planned) -> list[Any]:
    """The nodes giving a chord's body one value per header member: a member whose value
    is a list (a chain ending in a group: "the chain prevents unrolling", Celery's
    t/integration test_nested_chord_group_chain_group_tail) through a
    ``celery.accumulate`` node after its tails, which gives their list."""
    if not header.lists:
        return header.tails
    accumulate = builder.app.tasks["celery.accumulate"]
    values: list[Any] = []
    done = 0
    for start, stop in header.lists:
        values += header.tails[done:start]
        # A fan-in closing the group its member ends with (which marked its inputs).
        part = accumulate.s(index=0).to_flow(builder, after=header.tails[start:stop],
                                             many=True, failure="fail")
        values += part.tails
        done = stop
    return values + header.tails[done:]


def _with_callbacks(body: Signature, callbacks: dict[str, Any]) -> Signature:
    """A chord's body (a copy of the caller's) with the chord's ``link``/``link_error``
    options added to its own (Celery 5.7's ``_add_body_callbacks``): a callback linked as
    ``link()`` links it (a group's: to its first task, once); an errback linked to each task
    of a group body, else added to the body's ``link_error``."""
    for callback in listed(callbacks.get("link")):
        callback = maybe_signature(callback).clone()
        if isinstance(body, group) and not body.tasks:
            body.append_to_list_option("link", callback)
        else:
            body.link(callback)
    for errback in listed(callbacks.get("link_error")):
        errback = maybe_signature(errback)
        if isinstance(body, group):
            _link_error_to_group_body(body, errback)
        else:
            body.append_to_list_option("link_error", errback.clone())
    return body


def _link_error_to_group_body(sig: Signature, errback: Signature, *,
                              sent_as_group: bool = True) -> None:
    """Link a chord's ``link_error=`` to its group body as Celery 5.7 does: to each task
    (a chord's: to its body, never its header). A group sent as one whose options hold a
    ``link_error`` of its own (even empty) takes it there instead: when the group is sent
    that option replaces its tasks' errbacks, and a chord among them gets it, so linked to
    the tasks too it would be lost, or run twice. A group inside a group is flattened, its
    options dropped, so only the outer one counts."""
    if isinstance(sig, group):
        if sent_as_group and sig.options.get("link_error") is not None:
            sig.append_to_list_option("link_error", errback.clone())
            return
        for task in sig.tasks:
            _link_error_to_group_body(maybe_signature(task), errback, sent_as_group=False)
    elif isinstance(sig, _chord):
        _link_error_to_group_body(sig.body, errback)
    else:
        sig.link_error(errback.clone())


def _frozen_group_id(tasks: list[Any]) -> str | None:
    """The group id every task of a frozen header carries (a chord frozen, then copied or
    rebuilt from its dict), else None."""
    ids = {maybe_signature(task).options.get("group_id") for task in tasks}
    if len(ids) != 1:
        return None
    only = ids.pop()
    return str(only) if only else None


def _header_tasks(header: Any, app: Any) -> list[Any]:
    """A chord's header as its list of tasks (Celery's ``_maybe_group``): a list's items
    each made a signature of their own as ``signature()`` makes one (a copy of a
    signature, so the caller's are never changed by the chord; a task, called with no
    arguments: ``chord([tsum, tsum], body)``)."""
    if isinstance(header, dict) and not isinstance(header, Signature):
        header = maybe_signature(header, app=app)
    if isinstance(header, (group, _chain)):
        return list(header.tasks)
    if isinstance(header, Signature):
        return [header]
    return [signature(task, app=app) for task in header or ()]


#: Celery's ``celery.canvas._chain`` (what ``|`` and ``chain(...)`` build) under a name the
#: package's other modules may import: ``akadze_compat.canvas`` exports it as ``_chain``.
chain_class = _chain
