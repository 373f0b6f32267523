"""Sending a canvas: every task call in it becomes one node of one akadze_core ``Workflow``,
inserted by one statement.

Each node is the row a plain ``apply_async`` of that call would insert (``amqp.prepare``:
routing, ``meta["celery"]``, attempts, the task id in ``meta["task_id"]``), plus how it
waits: a chain step after the step before it, given its result (``pass_results="one"``, or
``"list"`` after a group) unless immutable, cancelled if that step fails; a chord body after
every header member with the list of their results, failed (``ChordError``) if one fails; a
``link=`` callback after its task. A ``link_error=`` errback is an ``OnFailure`` row,
inserted by the database when the job fails; the worker calls it Celery's way
(``worker.entry``). Ids are chosen here, before the insert, as Celery freezes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from json.encoder import encode_basestring
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Literal

from kombu.exceptions import EncodeError

from akadze_core import ConnectionLost, InvalidArgs, OnFailure
from akadze_core.integration import JobRequest, collector_paused, is_strict

from .. import serialization, signals
from ..backends.base import GROUP_BODY
from ..canvas.signatures import Signature, alike_plain, listed, maybe_signature
from ..result import AsyncResult, derived_results, give_job_ids
from ..utils import uuid
from .amqp import Message, PublishConnectionLost, current_session, prepare, publish_with_retry
from .routes import settings_router_state

if TYPE_CHECKING:
    import psycopg

    from akadze_core import Node, TaskCall

    from .base import Celery
    from .task import Task

__all__ = ["ERRBACK", "PASS", "Builder", "send_canvas", "send_linked"]

#: ``meta["celery"]`` key marking an errback job: ``{"immutable": bool}``.
ERRBACK = "errback"
#: Option values a reused row may be keyed on.
_PLAIN = (str, int, float, bool)
#: ``meta["celery"]`` key of a node given its upstreams' results: ``"one"`` or ``"list"``.
PASS = "pass"

#: Options that only shape the canvas (or Celery's messages), never a node's row.
_CANVAS_OPTIONS = ("link", "link_error", "group_id", "group_index", GROUP_BODY, "chord",
                   "chain", "reply_to", "add_to_parent", "producer", "publisher", "router",
                   "result_cls", "retries", "subtask_type", "stamped_headers", "stamps")


def _node_options(sig: Signature, task_type: Task | None) -> dict[str, Any]:
    """The options ``Task.apply_async`` would send this call with: the task's own
    execution options under the signature's."""
    return _options_of(sig.options, task_type)


def _options_of(sig_options: dict[str, Any], task_type: Task | None) -> dict[str, Any]:
    """``_node_options`` of a signature whose options are ``sig_options``."""
    options = {key: value for key, value in sig_options.items()
               if value is not None and key not in _CANVAS_OPTIONS}
    options.pop("task_id", None)
    serializer = options.pop("serializer", None)
    if serializer is not None and serializer != "json":
        serialization.check_serializer(serializer, "serializer")
    if task_type is not None:
        defaults = {key: value for key, value in task_type._get_exec_options().items()
                    if value is not None and key != "serializer"}
        options = {**defaults, **options}
        options.setdefault("ignore_result", task_type.ignore_result)
    return options


def _passing(after: list[Any], many: bool, immutable: bool) -> Literal["one", "list"] | None:
    """What a node takes from its upstreams: the one result, the list, or nothing."""
    if not after or immutable:
        return None
    return "list" if many else "one"


class Builder:
    """One workflow being built from a canvas (the ``FlowBuilder`` the signatures'
    ``to_flow`` add their calls to)."""

    def __init__(self, app: Celery, session: psycopg.Connection | None = None, *,
                 reuse: bool = True) -> None:
        self.app = app
        self.workflow = app.core.workflow()
        self.session = session
        self._sent: list[tuple[Node, AsyncResult, Message]] = []
        # Rows of calls alike (a group's members), built once and copied per node: see
        # _reused. ``reuse=False`` builds every row in full (what the copies must equal).
        self._reuse = reuse
        self._templates: dict[tuple[Any, ...], tuple[Message, JobRequest, dict[str, Any]]] = {}
        # id(node) -> (its task id, its root id): what a node after it is sent with
        self._ids: dict[int, tuple[str, str]] = {}
        # Group members known by the id derived from their job id, given once inserted
        # (sent with no publish signal receivers: nothing to tell after the insert).
        # Per run of them, its nodes and results side by side (no pair per member).
        self._derived: list[tuple[list[Node], list[AsyncResult]]] = []
        # Runs whose derived results are not made yet: how many are not placed, and
        # where those placed go (the list, the index of the first; its nodes, task name,
        # whether ignored), made while the insert runs (_make_results).
        self._unplaced = 0
        self._placed: list[tuple[list[Any], int, list[Node], str, bool]] = []

    def add_task(self, sig: Signature, *, after: list[Any], many: bool,
                 failure: str) -> tuple[Node, AsyncResult]:
        """Add one task call (a cloned single signature with its task id); its ``link``
        callbacks are added after it, its ``link_error`` errbacks to its row."""
        app = self.app
        task_type = sig.known_type
        task_id = str(sig.id or uuid())
        extra = {key: sig.options[key] for key in ("group_id", "group_index", GROUP_BODY)
                 if sig.options.get(key) is not None}
        passing = _passing(after, many, bool(sig.immutable))
        if passing is not None:
            # The worker reads it here: a claimed job carries its upstream results but
            # not its flow, and a passed None looks like nothing passed.
            extra[PASS] = passing
        links = listed(sig.options.get("link"))
        errbacks = listed(sig.options.get("link_error"))
        options = _node_options(sig, task_type)
        upstream = self._ids.get(id(after[-1])) if after else None
        if upstream is not None:
            # Celery sends a step once the one before it ended, from its worker: the step's
            # parent is that task, its root that task's root (a chord body: the header
            # member that ended last, here the last one)
            options["parent_id"], options["root_id"] = upstream
        reused = None
        if self._reuse and not links and not errbacks and not sig.options.get("shadow"):
            reused = self._reused(sig, task_type, task_id, options, extra)
        if reused is not None:
            message, request = reused
        else:
            message = prepare(app, sig.name, list(sig.args), dict(sig.kwargs), options,
                              task_id=task_id, link=links or None,
                              link_error=errbacks or None, shadow=sig.options.get("shadow"),
                              task_type=task_type, extra_meta=extra)
            request = message.request()
        return self.add_message(message, task_id, task_type, links, errbacks, after=after,
                                many=many, failure=failure, immutable=bool(sig.immutable),
                                request=request)

    def _reused(self, sig: Signature, task_type: Task | None, task_id: str,
                options: dict[str, Any], extra: dict[str, Any]
                ) -> tuple[Message, JobRequest] | None:
        """The row of ``sig`` copied from the row of a call alike already built here (same
        task, options and group), with its own args, task id and group index: a group of
        10,000 members is routed and configured once, not 10,000 times. None when the row
        may depend on more than that (publish signal receivers, a router function, options
        that are not plain values): then it is built in full."""
        template = self._template(sig.name, task_type, task_id, options, extra)
        if template is None:
            return None
        message, base, meta = template
        celery_meta = meta["celery"]
        if "group_index" in extra:
            celery_meta = {**celery_meta, "group_index": extra["group_index"]}
        args = _encoded(message, sig.args, sig.kwargs)
        node_meta = {**meta, "celery": celery_meta, "task_id": task_id}
        request = dataclasses.replace(base, args=args,
                                      meta=self.app.core.json_dumps(node_meta))
        return message, request

    def _template(self, name: str, task_type: Task | None, task_id: str,
                  options: dict[str, Any], extra: dict[str, Any]
                  ) -> tuple[Message, JobRequest, dict[str, Any]] | None:
        """The row template ``_reused`` copies (built by the first call alike), or None
        when rows cannot be shared."""
        if signals.before_task_publish.receivers or signals.after_task_publish.receivers:
            return None
        if not all(value is None or type(value) in _PLAIN for value in options.values()):
            return None
        conf = self.app.conf
        if not settings_router_state(conf)[1]:
            return None
        shared = {key: value for key, value in extra.items() if key != "group_index"}
        key = (name, id(task_type), tuple(sorted(options.items())),
               tuple(sorted(shared.items())))
        template = self._templates.get(key)
        if template is None:
            message = prepare(self.app, name, [], {}, dict(options), task_id=task_id,
                              link=None, link_error=None, shadow=None, task_type=task_type,
                              extra_meta=shared)
            meta = dict(message.call.options.meta)
            template = self._templates[key] = (message, message.request(), meta)
        return template

    def member_adder(self, options: dict[str, Any], *, after: list[Any], many: bool,
                     failure: str) -> MemberAdder:
        """What adds a group's plain members (see ``MemberAdder``); ``options``: the
        group's, its ``group_id`` included."""
        return MemberAdder(self, options, after=after, many=many, failure=failure)

    def add_message(self, message: Message, task_id: str, task_type: Task | None,
                    links: list[Any], errbacks: list[Any], *, after: list[Any], many: bool,
                    failure: str, immutable: bool = False,
                    request: JobRequest | None = None,
                    ignored: bool | None = None) -> tuple[Node, AsyncResult]:
        """Add a call prepared already (``amqp.prepare``; ``request``: its row, when built
        already; ``ignored``: whether its result is ignored, when known already), with its
        callbacks and errbacks."""
        if self.session is None:
            self.session = message.session
        passing = _passing(after, many, immutable)
        root_id = _root_id(message, task_id)
        node = self.workflow.add_request(
            request or message.request(), after=list(after) or None, pass_results=passing,
            on_upstream_failure="fail" if failure == "fail" else "cancel",
            on_failure=[self._errback(errback, task_id, root_id) for errback in errbacks])
        self._ids[id(node)] = (task_id, root_id)
        result = AsyncResult(task_id, app=self.app, task_name=message.name)
        result.ignored = _ignored(message, task_type) if ignored is None else ignored
        self._sent.append((node, result, message))
        for callback in links:
            maybe_signature(callback, app=self.app).clone().to_flow(
                self, after=[node], many=False, failure="cancel")
        return node, result

    def add_plain_nodes(self, message: Message, nodes: list[Node], last_task_id: str,
                        root_id: str | None, ignored: bool, unmade: list[Unmade]
                        ) -> tuple[list[Node], list[AsyncResult]]:
        """``add_message``'s bookkeeping for nodes added already (``Workflow.add_many``) of
        calls of ``message`` that wait on nothing and have no callbacks nor errbacks, and
        their results (``ignored``: whether their results are ignored), returned side by
        side. All but the last are known by the id derived from their job id once inserted
        (no node waits on them); the last has ``last_task_id``, its root id ``root_id`` or
        its own id. All but the last are made while the insert runs, ``UNMADE`` until
        then: the run is noted in ``unmade`` for ``place``."""
        if self.session is None:
            self.session = message.session
        app = self.app
        # (1.5-2.7 ms for 10,000, off the time before the first part of the insert leaves)
        results: list[Any] = [UNMADE] * (len(nodes) - 1)
        if len(nodes) > 1:
            unmade.append((nodes, message.name, ignored))
            self._unplaced += 1
        last = AsyncResult(last_task_id, app.backend, message.name, app)
        last.ignored = ignored
        self._ids[id(nodes[-1])] = (last_task_id, root_id or last_task_id)
        self._sent.append((nodes[-1], last, message))
        results.append(last)
        return nodes, results

    def place(self, results: list[Any], unmade: list[Unmade]) -> None:
        """Where the results not made yet of the runs of ``unmade`` are kept: in
        ``results`` (a group's result list), in the order of the runs."""
        start = 0
        for nodes, name, ignored in unmade:
            start = results.index(UNMADE, start)
            self._placed.append((results, start, nodes, name, ignored))
            start += len(nodes) - 1
        self._unplaced -= len(unmade)
        unmade.clear()

    def _make_results(self) -> None:
        """Make the results placed and not made yet, where they are kept."""
        app = self.app
        for results, start, nodes, name, ignored in self._placed:
            made = derived_results(app, app.backend, name, len(nodes) - 1, ignored=ignored)
            results[start:start + len(made)] = made
            self._derived.append((nodes, made))
        self._placed.clear()

    def _errback(self, errback: Any, failed_id: str, failed_root_id: str) -> OnFailure:
        """The row of an errback, inserted when the job of ``failed_id`` fails: sent by
        that task, as Celery's worker sends an old-style errback (its parent and root)."""
        sig = maybe_signature(errback, app=self.app)
        if not isinstance(sig, Signature) or sig.subtask_type:
            raise TypeError(f"link_error takes task signatures, not {sig!r}: call a "
                            "canvas from a single errback task")
        task_type = sig.known_type
        options = _node_options(sig, task_type)
        options["parent_id"], options["root_id"] = failed_id, failed_root_id
        message = prepare(self.app, sig.name, list(sig.args), dict(sig.kwargs), options,
                          task_id=str(sig.id or uuid()), link=None, link_error=None,
                          shadow=sig.options.get("shadow"), task_type=task_type,
                          extra_meta={ERRBACK: {"immutable": bool(sig.immutable)}})
        return OnFailure.from_request(message.request(), pass_error=True)

    def enqueue(self, retry: Any = None, retry_policy: Any = None, *,
                meanwhile: Callable[[], None] | None = None) -> None:
        """Insert every node in one transaction; the results learn their job ids. While the
        database cannot be reached the insert is retried as Celery retries a publish
        (``retry``, ``retry_policy``: ``apply_async``'s, else the settings). ``meanwhile``:
        called while the database inserts (``Workflow.enqueue``), or when a try fails
        before that (before a retry waits): it must do nothing when called again."""
        workflow = self.workflow
        if self.session is not None:
            workflow = workflow.using(session=self.session)
        if self._unplaced:
            raise RuntimeError("a group's results were not placed (MemberAdder.place)")

        def during() -> None:
            self._make_results()
            if meanwhile is not None:
                meanwhile()

        def send() -> Any:
            try:
                return workflow.enqueue(meanwhile=during)
            finally:
                during()

        try:
            publish_with_retry(self.app, send, retry, retry_policy)
        except InvalidArgs as exc:
            raise EncodeError(str(exc)) from exc
        except ConnectionLost as exc:
            raise PublishConnectionLost(str(exc)) from exc.__cause__
        for nodes, results in self._derived:
            # Its id, the task id derived from it when asked for (the last node's result
            # is not derived: it is in _sent).
            give_job_ids(results, map(attrgetter("id"), nodes))
        for node, result, message in self._sent:
            result.job_id = node.id
            message.published(result.id)


class MemberAdder:
    """Adds the plain members of one group (task signatures with no options of their own,
    the ``task.s(...)`` of ``group(task.s(i) for i in ...)``): exactly the nodes and results
    that ``member.to_flow(builder, args, kwargs, options={**options, "group_index": i})``
    gives, without what that spends per member on a copy that nothing else sees (clone,
    deepcopy of its options, freeze), on options and routing that are the same for every
    member, or on encoding each member's row alone: a run of members waiting on nothing is
    checked and encoded in bulk (``Workflow.add_many``, its metas spliced), others one
    by one, their meta spliced around the group index and the task id. A member it does not
    take goes the full way."""

    def __init__(self, builder: Builder, options: dict[str, Any], *, after: list[Any],
                 many: bool, failure: str) -> None:
        self.builder, self.options = builder, options
        self.after, self.many, self.failure = after, many, failure
        # Options that make a member's row its own: those go the full way.
        self.enabled = builder._reuse and not any(
            options.get(key) for key in ("link", "link_error", "shadow", "task_id"))
        # Per (task name, task, immutable): its template and its meta's text around the
        # group index and the task id, or None (rows not shared: the full way).
        self._rows: dict[tuple[Any, ...], _Row | None] = {}
        # Its runs whose results are not made yet (Builder.add_plain_nodes), in order.
        self._unmade: list[Unmade] = []

    def take(self, member: Signature) -> _Row | None:
        """What ``add`` adds ``member`` with when it is plain and its rows can be shared,
        else None. (A plain Signature is read as the dict it is: its properties, a frame
        each, were a tenth of a member's time.)"""
        if not self.enabled or type(member) is not Signature or member.get("options"):
            return None
        immutable = bool(member.get("immutable"))
        key = (member.get("task"), id(member.known_type), immutable)
        rows = self._rows
        if key in rows:
            return rows[key]
        row = rows[key] = self._row(member, immutable)
        return row

    def take_all(self, members: list[Any]) -> _Row | None:
        """``take``'s row when it is the same for every one of ``members`` (all plain, of
        one task and app, alike in immutability), told at once; else None."""
        if not self.enabled or not alike_plain(members):
            return None
        return self.take(members[0])

    def add(self, runs: list[tuple[_Row, int, list[Signature]]], args: Any,
            kwargs: Any) -> tuple[list[Node], list[AsyncResult]]:
        """Add runs of members (their row, the group index of the first, the members) with
        the group's partial ``args``/``kwargs``; their nodes and results, in order, side by
        side (no pair per member to build and take apart)."""
        nodes: list[Node] = []
        results: list[AsyncResult] = []
        for row, start, members in runs:
            if self.after or not row.bulk:
                for index, member in enumerate(members, start):
                    node, result = self._one(row, member, index, args, kwargs)
                    nodes.append(node)
                    results.append(result)
            else:
                added_nodes, added_results = self._bulk(row, start, members, args, kwargs)
                nodes += added_nodes
                results += added_results
        return nodes, results

    def place(self, results: list[Any]) -> None:
        """Where the results ``add`` gave are kept (the group's result list): those not
        made yet are made there while the insert runs (``Builder.place``)."""
        self.builder.place(results, self._unmade)

    @staticmethod
    def _payload(member: Signature, immutable: bool, args: Any,
                 kwargs: Any) -> dict[str, Any]:
        """The job args of ``member`` called with the group's partial ``args``/``kwargs``."""
        if immutable:
            return {"args": list(member["args"]), "kwargs": dict(member["kwargs"])}
        # Signature._merge: partial args first, partial kwargs win
        return {"args": [*(args or ()), *member["args"]],
                "kwargs": {**member["kwargs"], **(kwargs or {})}}

    def _one(self, row: _Row, member: Signature, index: int, args: Any,
             kwargs: Any) -> tuple[Node, AsyncResult]:
        """One member, its meta spliced (after upstreams, or with a custom dumps)."""
        message, base = row.message, row.base
        task_id = uuid()
        payload = self._payload(member, row.immutable, args, kwargs)
        try:
            encoded = message.call.encode_args(payload)
        except InvalidArgs as exc:
            raise EncodeError(str(exc)) from exc
        request = JobRequest(base.task, base.queue, encoded, base.priority, base.scheduled_at,
                             base.delay, base.max_attempts, base.expires_at, base.unique_key,
                             f"{row.head}{index}{row.tail}{encode_basestring(task_id)}}}")
        return self.builder.add_message(message, task_id, row.task_type, [], [],
                                        after=self.after, many=self.many,
                                        failure=self.failure, immutable=row.immutable,
                                        request=request, ignored=row.ignored)

    def _bulk(self, row: _Row, start: int, members: list[Signature], args: Any,
              kwargs: Any) -> tuple[list[Node], list[AsyncResult]]:
        """Members waiting on nothing, checked and encoded at once with their metas."""
        message = row.message
        if (row.immutable or (not args and not kwargs)) and _as_stored(members):
            # Their own args and kwargs, encoded as they are: copies would encode alike
            payloads = [{"args": member["args"], "kwargs": member["kwargs"]}
                        for member in members]
        else:
            payloads = [self._payload(member, row.immutable, args, kwargs)
                        for member in members]
        # A member gets no task id of its own: it is known by the id derived from its job
        # id (akadze_core.model.task_ids; no bytes nor index entry per member), learnt once
        # inserted; its meta is the group's, one for all, and its group index its job's
        # position (first_position: nothing per member to encode, send or parse but its
        # args; the worker reads request.group_index from Job.position). Only the last one
        # gets a uuid now, its meta spliced as _one splices it (its group index in it): a
        # node after the group (a chord's body) is sent with it.
        last = uuid()
        builder = self.builder
        workflow = builder.workflow
        try:
            # Encoded as the insert goes (deferred): a big group's parts are encoded while
            # the database inserts the ones before, its first bad member's error raised by
            # the insert (Builder.enqueue), nothing inserted.
            nodes = workflow.add_many(row.numbered, payloads[:-1], first_position=start,
                                      deferred=True) if len(members) > 1 else []
            nodes += workflow.add_many(
                message.call, payloads[-1:],
                meta_texts=[f'{row.head}{start + len(members) - 1}{row.tail}"{last}"}}'])
        except (TypeError, InvalidArgs) as exc:
            # The error of the first bad member, as adding them one by one raises it.
            for payload in payloads:
                try:
                    message.call.encode_args(payload)
                except InvalidArgs as first:
                    raise EncodeError(str(first)) from first
            if isinstance(exc, InvalidArgs):
                raise EncodeError(str(exc)) from exc
            raise
        return builder.add_plain_nodes(message, nodes, last, row.root_id, row.ignored,
                                       self._unmade)

    def _row(self, member: Signature, immutable: bool) -> _Row | None:
        """The template of ``member``'s rows (as ``Builder.add_task`` and ``_reused``
        build it) and its meta's text before the group index and before the task id;
        None when rows are not shared or the meta's text cannot be spliced."""
        builder, after = self.builder, self.after
        task_type = member.known_type
        sig_options = {**self.options, "group_index": 0}
        extra = {key: sig_options[key] for key in ("group_id", "group_index", GROUP_BODY)
                 if sig_options.get(key) is not None}
        passing = _passing(after, self.many, immutable)
        if passing is not None:
            extra[PASS] = passing
        options = _options_of(sig_options, task_type)
        upstream = builder._ids.get(id(after[-1])) if after else None
        if upstream is not None:
            options["parent_id"], options["root_id"] = upstream
        template = builder._template(member.name, task_type, uuid(), options, extra)
        if template is None or "group_index" not in extra:
            return None
        message, base, meta = template
        dumps = builder.app.core.json_dumps
        celery_meta = {key: value for key, value in meta["celery"].items()
                       if key != "group_index"}
        head = dumps({"celery": celery_meta})[:-2]  # '{"celery":{...' open at its end
        head += ',"group_index":' if celery_meta else '"group_index":'
        tail = '},"task_id":'
        # Spliced text must be what encoding the node's meta gives (a custom dumps may
        # space or order it otherwise): checked once, on a sample.
        sample = {**meta, "celery": {**celery_meta, "group_index": 7}, "task_id": "x"}
        if list(meta) != ["celery", "task_id"] \
                or dumps(sample) != f'{head}7{tail}{encode_basestring("x")}}}' \
                or dumps({"celery": sample["celery"]}) != f'{head}7}}}}':
            return None
        root_id = celery_meta.get("root_id")
        # The call of members in bulk: the meta of each but its group index (its position).
        numbered = message.call.configure(meta={"celery": celery_meta})
        return _Row(message, base, head, tail, task_type, _ignored(message, task_type),
                    immutable, None if root_id is None else str(root_id),
                    bulk=is_strict(dumps), numbered=numbered)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _Row:
    """What a group's plain members of one task share (``MemberAdder._row``): the row
    template and its message, the meta's text before the group index and before the task
    id, the task, whether results are ignored, whether the members are immutable, their
    root id when sent with one, whether the app's dumps is the one ``Workflow.add_many``
    encodes in bulk with, and the call members are added in bulk with (its meta theirs but
    the group index, which is their jobs' position)."""

    message: Message
    base: JobRequest
    head: str
    tail: str
    task_type: Task | None
    ignored: bool
    immutable: bool
    root_id: str | None
    bulk: bool
    numbered: TaskCall


#: A group member's result not made yet, in the lists results pass through until the
#: group's own (``Builder.place``): made there while the insert runs.
UNMADE: Any = object()
#: A run of members whose results are not made yet: its nodes (the last one's result is
#: made), its task name, whether their results are ignored.
Unmade = tuple[list["Node"], str, bool]


def _as_stored(members: list[Signature]) -> bool:
    """Whether every member's args are a tuple or list and its kwargs a dict: what they
    are encoded as (other iterables and mappings are copied into those first)."""
    return set(map(type, map(itemgetter("args"), members))) <= {tuple, list} \
        and set(map(type, map(itemgetter("kwargs"), members))) == {dict}


def _ignored(message: Message, task_type: Task | None) -> bool:
    """Whether the result of ``message``'s call is ignored."""
    ignore_result = message.ignore_result
    if ignore_result is None and task_type is not None:
        ignore_result = task_type.option("ignore_result", "task_ignore_result")
    return bool(ignore_result)


def _encoded(message: Message, args: Any, kwargs: Any) -> str:
    """A call's args as its job row holds them (``EncodeError`` when they are not JSON)."""
    try:
        return message.call.encode_args({"args": list(args), "kwargs": dict(kwargs)})
    except InvalidArgs as exc:
        raise EncodeError(str(exc)) from exc


def _root_id(message: Message, task_id: str) -> str:
    """The root id the task of ``message`` runs with: as sent, or its own id."""
    celery_meta = message.call.options.meta.get("celery") or {}
    return str(celery_meta.get("root_id") or task_id)


def send_canvas(app: Celery, sig: Signature, args: Any, kwargs: Any,
                options: dict[str, Any]) -> Any:
    """Send a canvas (one workflow, one statement); returns its result, as Celery's
    ``apply_async`` of that canvas does."""
    options = dict(options)
    builder = Builder(app, current_session(options.pop("connection", None)))
    # A big group's rows built with the collector paused (akadze_core.enqueue.gcpause)
    # until its insert is sent, the young collection over them made while the database
    # inserts; the pause ends with the first try at the latest (never over a retry's wait).
    with collector_paused() as resume:
        planned = sig.to_flow(builder, args, kwargs, after=[], many=False, failure="cancel",
                              options=options)
        builder.enqueue(meanwhile=resume)
    return planned.result


def send_linked(message: Message, task_id: str, link: Any, link_error: Any,
                task_type: Task | None, retry: Any = None,
                retry_policy: Any = None) -> AsyncResult:
    """Send one call with ``link=``/``link_error=`` (``apply_async``'s): a workflow of the
    call, its callbacks after it and its errbacks on its row."""
    builder = Builder(message.app)
    _, result = builder.add_message(message, task_id, task_type, listed(link),
                                    listed(link_error), after=[], many=False,
                                    failure="cancel")
    builder.enqueue(retry, retry_policy)
    return result
