"""Workflows: jobs that wait for other jobs (chains, fan-out/fan-in) and jobs inserted when
one fails (errbacks), all inserted in one statement.

What follows from an outcome is written in the transaction that writes the outcome
(``akadze.settle``, called by the statements that finish jobs): a waiting job is released
when its last upstream succeeds, ended when one fails or is cancelled, and a failed job's
errbacks are inserted. A worker killed between the two cannot lose the next step, and a
retried, rescued or fenced-off run cannot release it twice.

>>> flow = app.workflow()
>>> page = flow.add(fetch, url=url)
>>> flow.add(parse, after=page, result_arg="html")       # parse(html=<fetch's result>)
>>> parts = [flow.add(resize, image=name) for name in names]
>>> flow.add(archive, after=parts, result_arg="paths")   # archive(paths=[...in order])
>>> flow.enqueue()                                       # one statement; ids in add order
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import psycopg

from ..model.errors import UpstreamFailed
from ..store import database
from ..store.database import JobRequest
from ..store.dberrors import SCHEMA_ERRORS
from ..store.migrations import schema_missing
from .gcpause import collector_paused
from .nodes import Block, Node, OnFailure

if TYPE_CHECKING:
    from ..store.connections import Connections
    from .encoding import Rows
    from .tasks import TaskCall

__all__ = ["Workflow"]

#: How a waiting job takes its upstreams' results: the single upstream's value, or the list.
Pass = Literal["one", "list"]
#: What a waiting job becomes when an upstream fails or is cancelled.
UpstreamFailure = Literal["cancel", "fail"]


class WorkflowHost(Protocol):
    """What a workflow needs of its app (an ``App`` is one): the connections its insert
    runs on and the command ``SchemaMissing`` names. A protocol, so that this module does
    not import the app that imports it."""

    @property
    def connections(self) -> Connections: ...

    @property
    def migrate_command(self) -> str: ...


class Workflow:
    """Jobs to insert together, some waiting on others; ``enqueue`` inserts them all in one
    statement (on ``using(session=...)``'s connection: in the caller's transaction)."""

    def __init__(self, app: WorkflowHost) -> None:
        self.app = app
        self.nodes: list[Node] = []
        # Per node: its upstreams (-k: node k of this workflow, else a job id), the nodes
        # waiting on it (1-based), and how many of its upstreams are in this workflow.
        self._upstreams: list[list[int] | None] = []
        self._dependents: list[list[int] | None] = []
        self._pending: list[int] = []
        # Jobs enqueued before that nodes wait on: each edge (job id, 1-based node).
        self._outside: list[tuple[int, int]] = []
        self._flow: list[str | None] = []
        self._on_failure: list[str | None] = []
        # Per node, its template: the options it shares with others (task, queue, priority,
        # attempts, times), sent once per template, not once per job. Per template (by
        # index): its JSON and the meta of its first node, which its nodes with the same
        # meta do not repeat.
        self._template_of: list[int] = []
        self._templates: dict[tuple[Any, ...], int] = {}
        self._template_json: list[str] = []
        self._template_meta: list[str] = []
        # add_many's blocks by their first node's index.
        self._blocks: dict[int, Block] = {}
        self._session: Any = None

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, call: TaskCall, /, *, after: Node | int | Sequence[Node | int] | None = None,
            result_arg: str | None = None, on_upstream_failure: UpstreamFailure = "cancel",
            on_failure: Iterable[OnFailure] = (), **kwargs: Any) -> Node:
        """Add a job of ``call`` (a task, or one configured with ``configure``) with
        ``kwargs`` as its arguments.

        ``after``: a node of this workflow or the id of a job enqueued before, or a list of
        them; the job waits until all of them succeeded. ``result_arg``: the argument that
        receives their results (the value for a single ``after``, the list in order for a
        list). ``on_upstream_failure``: when one of them fails or is cancelled this job is
        cancelled (``"cancel"``) or fails (``"fail"``, which runs its errbacks); it never
        runs. ``on_failure``: errbacks. A delay configured on the call counts from the
        release.
        """
        if after is None and result_arg is None and on_upstream_failure == "cancel" \
                and on_failure == ():
            return self._add_plain(call.request(kwargs))
        if result_arg is not None and after is None:
            raise ValueError("result_arg needs after=: the jobs whose results it receives")
        request = call.request(kwargs, provided=() if result_arg is None else (result_arg,))
        single = after is not None and not isinstance(after, Sequence)
        pass_results: Pass | None = None
        if result_arg is not None:
            pass_results = "one" if single else "list"
        return self.add_request(request, after=after, pass_results=pass_results,
                                result_arg=result_arg, on_upstream_failure=on_upstream_failure,
                                on_failure=on_failure)

    def add_many(self, call: TaskCall, kwargs_list: Iterable[Mapping[str, Any]], *,
                 metas: Iterable[Mapping[str, Any]] | None = None,
                 meta_texts: Iterable[str] | None = None,
                 first_position: int | None = None, deferred: bool = False) -> list[Node]:
        """Add one job of ``call`` per argument set (a fan-out), checked and encoded in bulk
        as ``enqueue_many`` does (``TypeError`` or ``InvalidArgs`` for the first bad one, and
        nothing is added then). ``metas``: each job's own meta, in place of the call's (an
        integration's per-job ids), encoded and checked with its args; or ``meta_texts``,
        those metas encoded already; or ``first_position``: each job's index in the
        fan-out, stored in its row (``Job.position``: ``first_position``, then one more
        per job), the call's meta shared by all (``TaskCall.rows``).

        ``deferred``: the args are encoded by ``enqueue``, as its insert goes: a big
        fan-out is sent in parts, each encoded while the database inserts the one before
        (in one transaction). ``enqueue`` raises the ``InvalidArgs`` of the first bad job
        then, with nothing inserted; the arguments must not change until it is called."""
        if call.options.unique_key is not None:
            raise ValueError("a workflow job cannot have a unique_key")
        return self.add_rows(call.rows(kwargs_list, metas, meta_texts=meta_texts,
                                       first_position=first_position, deferred=deferred))

    def add_rows(self, rows: Rows) -> list[Node]:
        """``add_many`` of jobs encoded already (``TaskCall.rows``; integrations such as
        akadze_compat)."""
        template = rows.template
        if template.unique_key is not None:
            raise ValueError("a workflow job cannot have a unique_key")
        count = rows.count
        if not count:
            return []
        start = len(self.nodes)
        index = self._template(template)
        if not rows.pairs and self._template_meta[index] != template.meta:
            # Its jobs take their template's meta: a template of their own, so that the
            # block is still sent as its arrays are (not node by node).
            index = self._template(template, with_meta=True)
        block = Block(rows, start, index)
        nodes = [Node(index, None, None, block) for index in range(start, start + count)]
        self.nodes.extend(nodes)
        self._blocks[start] = block
        for column in (self._flow, self._on_failure, self._upstreams, self._dependents):
            column.extend([None] * count)
        self._pending.extend([0] * count)
        self._template_of.extend([block.template] * count)
        return nodes

    def add_request(self, request: JobRequest, *,
                    after: Node | int | Sequence[Node | int] | None = None,
                    pass_results: Pass | None = None, result_arg: str | None = None,
                    on_upstream_failure: UpstreamFailure = "cancel",
                    on_failure: Iterable[OnFailure] = ()) -> Node:
        """``add`` for a request built elsewhere (``TaskCall.request``; integrations such as
        akadze_compat): ``pass_results`` says whether ``upstream_results`` gets the single
        upstream's result (``"one"``) or the list (``"list"``), which the worker gives the
        task as ``result_arg`` when that is set (akadze_compat reads it from the job)."""
        if after is None and pass_results is None and result_arg is None \
                and on_upstream_failure == "cancel" and type(on_failure) in (list, tuple) \
                and not on_failure:
            return self._add_plain(request)
        if request.unique_key is not None:
            raise ValueError("a workflow job cannot have a unique_key")
        if on_upstream_failure not in ("cancel", "fail"):
            raise ValueError("on_upstream_failure must be 'cancel' or 'fail'")
        if pass_results not in (None, "one", "list"):
            raise ValueError("pass_results must be None, 'one' or 'list'")
        upstreams = [] if after is None else [after] if not isinstance(after, Sequence) \
            else list(after)
        if after is not None and not upstreams:
            raise ValueError("after= is an empty list: the job would wait on nothing")
        refs = [self._ref(upstream) for upstream in upstreams]
        if pass_results == "one" and len(refs) != 1:
            raise ValueError("pass_results='one' needs exactly one upstream")
        flow: dict[str, Any] = {}
        if pass_results is not None:
            if not refs:
                raise ValueError("pass_results needs after=: the jobs whose results it passes")
            flow["pass"] = pass_results
        if result_arg is not None:
            flow["result_arg"] = result_arg
        if on_upstream_failure == "fail":
            flow["on_upstream_failure"] = "fail"
        if refs and request.delay:
            flow["delay"] = request.delay
        errbacks = [errback.spec() for errback in on_failure]
        node = Node(len(self.nodes), request)
        self.nodes.append(node)
        self._template_of.append(self._template(request))
        self._upstreams.append(refs or None)
        self._dependents.append(None)
        # An upstream named twice is waited on once (its result is passed twice): settle
        # counts a job down once per entry in its upstream's dependents, one entry each.
        distinct = list(dict.fromkeys(refs))
        self._pending.append(sum(1 for ref in distinct if ref < 0))
        for ref in distinct:
            if ref < 0:
                waiting = self._dependents[-ref - 1]
                if waiting is None:
                    self._dependents[-ref - 1] = [node.index + 1]
                else:
                    waiting.append(node.index + 1)
            else:
                self._outside.append((ref, node.index + 1))
        self._flow.append(json.dumps(flow) if flow else None)
        self._on_failure.append(f"[{', '.join(errbacks)}]" if errbacks else None)
        return node

    def _add_plain(self, request: JobRequest) -> Node:
        """``add_request`` of a job that waits on nothing and has no errbacks (a group's
        member), without its checks of what is not given."""
        if request.unique_key is not None:
            raise ValueError("a workflow job cannot have a unique_key")
        node = Node(len(self.nodes), request)
        self.nodes.append(node)
        self._template_of.append(self._template(request))
        self._upstreams.append(None)
        self._dependents.append(None)
        self._pending.append(0)
        self._flow.append(None)
        self._on_failure.append(None)
        return node

    def _template(self, request: JobRequest, *, with_meta: bool = False) -> int:
        """The index of the template ``request`` shares with the nodes alike (added when
        it is the first of its kind); ``with_meta``: alike in their meta too."""
        key: tuple[Any, ...] = (request.task, request.queue, request.priority,
                                request.max_attempts, request.scheduled_at, request.delay,
                                request.expires_at)
        if with_meta:
            key += (request.meta,)
        index = self._templates.get(key)
        if index is None:
            index = self._templates[key] = len(self._template_json)
            self._template_json.append(_template_json(request))
            self._template_meta.append(request.meta)
        return index

    def mark_inputs(self, first: Node) -> int:
        """Mark the nodes added since ``first`` (itself included) as the inputs of the
        fan-in added next (a job with ``on_upstream_failure="fail"``, such as a Celery
        chord's body): a failure or cancellation *before* them, reaching them through an
        upstream added before ``first`` (or a job enqueued earlier), cancels that fan-in
        rather than failing it, so its errbacks do not run for a failure that is not its
        inputs'. A failure among the inputs still fails it. Marks nest: call it for each
        fan-in whose inputs start at ``first``. Returns how many nodes were marked (those
        waiting on something before ``first``)."""
        if not self._owns(first):
            raise ValueError("mark_inputs takes a node of this workflow")
        start = first.index
        marked = 0
        # Node k's ref is -(k + 1): a ref of -start or more names a node before `first`, or
        # a job id (positive).
        for index in range(start, len(self.nodes)):
            refs = self._upstreams[index]
            if refs is None or not any(ref >= -start for ref in refs):
                continue
            text = self._flow[index]
            if text is None or text == "{}":
                self._flow[index] = '{"enters": 1}'
            elif '"enters"' not in text:
                # A JSON object json.dumps wrote: the key spliced in before its brace (a
                # 10,000-member group after a step: 43 -> ~5 ms against a parse per node).
                self._flow[index] = f'{text[:-1]}, "enters": 1}}'
            else:
                flow = json.loads(text)
                flow["enters"] += 1
                self._flow[index] = json.dumps(flow)
            marked += 1
        return marked

    def _owns(self, node: Node) -> bool:
        return node.index < len(self.nodes) and self.nodes[node.index] is node

    def _ref(self, upstream: Node | int) -> int:
        if isinstance(upstream, Node):
            if not self._owns(upstream):
                raise ValueError("after= names a node of another workflow")
            return upstream.ref
        if isinstance(upstream, bool) or not isinstance(upstream, int) or upstream <= 0:
            raise TypeError(f"after= takes nodes of this workflow or job ids, not {upstream!r}")
        return upstream

    def using(self, *, session: psycopg.Connection | psycopg.AsyncConnection) -> Workflow:
        """Enqueue on ``session``, inside its current transaction (returns this workflow)."""
        self._session = session
        return self

    def params(self) -> dict[str, Any]:
        """The insert statement's parameters: the templates, and the nodes as JSON arrays of
        up to ``CHUNK``, each of one template (``job_insert_rows``, and ``job_insert_graph``
        with the graph's parameters when a job waits on another or has errbacks)."""
        graph = self._graph()
        chunks: list[str] = []
        chunk_template: list[int] = []
        for text, template in self._chunks(graph):
            chunks.append(text)
            chunk_template.append(template)
        params: dict[str, Any] = {"templates": f"[{','.join(self._template_json)}]",
                                  "nodes": chunks, "chunk_template": chunk_template}
        if graph:
            params["external"] = sorted({ref for ref, _ in self._outside})
            params["external_ref"] = [ref for ref, _ in self._outside]
            params["external_node"] = [node for _, node in self._outside]
        return params

    def _graph(self) -> bool:
        """Whether a job waits on another or has errbacks (``job_insert_graph``)."""
        return bool(self._outside) or any(self._pending) or any(self._flow) \
            or any(self._on_failure)

    def _streamed(self) -> bool:
        """Whether ``enqueue`` sends the insert in parts (``_parts``): jobs of a deferred
        ``add_many`` to encode, more than a first part's worth, none waiting on another."""
        return len(self.nodes) > FIRST_PART * CHUNK \
            and any(block.rows.deferred for block in self._blocks.values()) \
            and not self._graph()

    def _parts(self) -> Iterator[dict[str, Any]]:
        """``params`` of ``job_insert_rows`` for a part of the arrays at a time, each part
        made (its deferred arrays encoded, the collector paused) once the one before it was
        sent: ``FIRST_PART`` arrays first, so that the database starts early, then
        ``PART_GROWTH`` times as many as the part before, so that a part is encoded well
        within the insert of the one before (a job's encoding is a tenth of its insert) in
        few statements (a 10,000-job group in three)."""
        templates = f"[{','.join(self._template_json)}]"
        chunks = self._chunks(False)
        size = FIRST_PART
        while True:
            with collector_paused():
                part = list(itertools.islice(chunks, size))
            if not part:
                return
            yield {"templates": templates, "nodes": [text for text, _ in part],
                   "chunk_template": [template for _, template in part]}
            size *= PART_GROWTH

    def _chunks(self, graph: bool) -> Iterator[tuple[str, int]]:
        """The nodes as the insert statements take them, in order: each JSON array of up to
        ``CHUNK`` nodes with its template's number (counted from 1); a deferred block's
        arrays encoded as they are reached."""
        template_of, template_meta = self._template_of, self._template_meta
        upstreams, dependents = self._upstreams, self._dependents
        nodes, blocks = self.nodes, self._blocks
        run: list[str] = []
        current = -1
        index, count = 0, len(nodes)
        while index < count:
            block = blocks.get(index)
            downs = None if block is None else self._direct(block)
            if block is not None and downs is not None:
                # Its arrays as add_many encoded them: no text per node here.
                if run:
                    yield f"[{','.join(run)}]", current + 1
                    run = []
                current = -1
                rows = block.rows
                for chunk in range(rows.chunk_count):
                    text = rows.chunk(chunk)[0]
                    yield (_with_downs(text, downs) if downs else text), block.template + 1
                index += rows.count
                continue
            end = min((start for start in blocks if start > index), default=count)
            for index in range(index, end):  # noqa: B020  # the while loop goes on from end
                node = nodes[index]
                request = node.request
                position = node.position
                template = template_of[index]
                if template != current or len(run) == CHUNK:
                    if run:
                        yield f"[{','.join(run)}]", current + 1  # the statement counts from 1
                    run = []
                    current = template
                meta = request.meta
                own_meta = meta is not template_meta[template] \
                    and meta != template_meta[template]
                if graph and (upstreams[index] is not None or dependents[index] is not None
                              or self._flow[index] is not None
                              or self._on_failure[index] is not None
                              or position is not None):
                    run.append(self._element(index, request, own_meta, position))
                elif own_meta:
                    run.append(f"[{request.args},{meta}]")
                else:
                    run.append(request.args)
            index = end
        if run:
            yield f"[{','.join(run)}]", current + 1

    def _direct(self, block: Block) -> str | None:
        """How ``block``'s arrays are sent as they are: ``""`` when none of its nodes is
        waited on, the nodes waiting on them (an array literal, sent once per array) when
        every node of the block has the same (a chord's members), None when they cannot
        be (then node by node: only in a graph, where a node may carry its position). A
        block's nodes never wait themselves nor have errbacks (add_many adds none), and
        carry their own meta or their template's (add_rows gives them a template)."""
        rows = block.rows
        dependents = self._dependents[block.start:block.start + rows.count]
        first = dependents[0]
        if dependents.count(first) != rows.count:  # one C-level pass, == per node
            return None
        return "" if first is None else _literal(first)

    def _element(self, index: int, request: JobRequest, own_meta: bool,
                 position: int | None = None) -> str:
        """Node ``index`` as job_insert_graph takes a node that waits or is waited on, or
        has a position: [args, meta, flow, on_failure, upstreams, dependents, pending,
        waits_outside, position], its trailing nulls left out."""
        refs = self._upstreams[index]
        downs = self._dependents[index]
        flow = self._flow[index]
        on_failure = self._on_failure[index]
        parts = [request.args, request.meta if own_meta else "null", flow or "null",
                 on_failure or "null", "null" if refs is None else f'"{_literal(refs)}"',
                 "null" if downs is None else f'"{_literal(downs)}"']
        pending = self._pending[index]
        outside = refs is not None and max(refs) > 0
        if pending or outside or position is not None:
            parts += [str(pending), "true" if outside else "false"]
            if position is not None:
                parts.append(str(position))
        else:
            while parts[-1] == "null":
                parts.pop()
        return f"[{','.join(parts)}]"

    def _assign(self, ids: list[int]) -> list[int]:
        for node, job_id in zip(self.nodes, ids, strict=True):
            node.id = job_id
        return ids

    def enqueue(self, *, meanwhile: Callable[[], object] | None = None) -> Any:
        """Insert every job in one transaction; returns their ids in add order (an
        awaitable of them on an async session). Raises ``UpstreamFailed`` when ``after=``
        names a job that failed, was cancelled or does not exist; nothing is inserted then.

        ``meanwhile``: work to do while the database inserts, called once the insert is
        sent in full (a ``deferred`` fan-out sent in parts: once its last part is), else
        just before it is sent (again if it is sent again); not called when the insert
        fails before that."""
        if not self.nodes:
            return []
        session = self._session
        if session is None and self._streamed():
            with self._translated():
                ids = self.app.connections.run_pooled(
                    lambda connection: database.insert_rows_pipelined(
                        connection, self._parts(), meanwhile), UNSURE)
            return self._assign(ids)
        with collector_paused():
            params = self.params()
        if meanwhile is not None:
            meanwhile()
        if isinstance(session, psycopg.AsyncConnection):
            return self._async_on(session, params)
        with self._translated():
            if session is not None:
                ids = database.insert_graph(session, params)
            else:
                ids = self.app.connections.run_pooled(
                    lambda connection: database.insert_graph(connection, params), UNSURE)
        return self._assign(ids)

    async def _async_on(self, session: psycopg.AsyncConnection,
                        params: dict[str, Any]) -> list[int]:
        with self._translated():
            ids = await database.insert_graph_async(session, params)
        return self._assign(ids)

    async def enqueue_async(self, *, meanwhile: Callable[[], object] | None = None
                            ) -> list[int]:
        """Async twin of ``enqueue`` (its insert always one statement: ``meanwhile`` is
        called just before it is sent)."""
        if not self.nodes:
            return []
        if self._session is not None and not isinstance(self._session, psycopg.AsyncConnection):
            raise TypeError("enqueue_async needs an async session; use enqueue()")
        with collector_paused():
            params = self.params()
        if meanwhile is not None:
            meanwhile()
        if self._session is not None:
            return await self._async_on(self._session, params)
        with self._translated():
            ids = await self.app.connections.run_pooled_async(
                lambda connection: database.insert_graph_async(connection, params), UNSURE)
        return self._assign(list(ids))

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """The insert's errors as callers see them: ``SchemaMissing`` for a missing schema,
        ``UpstreamFailed`` for a refused workflow, any other as it is."""
        try:
            yield
        except SCHEMA_ERRORS as exc:
            raise schema_missing(command=self.app.migrate_command) from exc
        except psycopg.Error as exc:
            raise _refused(exc) from None


#: What a connection lost after sending the insert leaves unknown (``ConnectionLost``).
UNSURE = "the workflow may or may not have been enqueued (all of it or none)"


#: Nodes per JSON array of the insert statements (as enqueue_many's arrays).
CHUNK = 100
#: Arrays in the first statement of an insert sent in parts (``Workflow._parts``), and
#: how many times as many each next statement takes.
FIRST_PART = 5
PART_GROWTH = 4


def _literal(numbers: list[int]) -> str:
    """A Postgres array literal (``{1,-2}``), cast in the statement."""
    return "{" + ",".join(map(str, numbers)) + "}"


def _with_downs(chunk: str, downs: str) -> str:
    """An add_many array (``[...]``, or an object ``{"args": [...], ...}``) as an object
    giving each of its jobs the dependents ``downs`` (job_insert_graph's ``downs``)."""
    if chunk[0] == "[":
        return f'{{"args":{chunk},"downs":"{downs}"}}'
    return f'{chunk[:-1]},"downs":"{downs}"}}'


def _template_json(request: JobRequest) -> str:
    """The options of ``request`` that its template stands for, as the insert statements
    take them (``meta`` spliced in as it is: already-validated JSON text)."""
    # A non-finite delay is not JSON; Postgres' float8 reads it from a string.
    delay: float | str = request.delay if math.isfinite(request.delay) else str(request.delay)
    head = json.dumps({
        "task": request.task, "queue": request.queue, "priority": request.priority,
        "max_attempts": request.max_attempts, "delay": delay,
        "at": request.scheduled_at.isoformat() if request.scheduled_at else None,
        "expires_at": request.expires_at.isoformat() if request.expires_at else None,
    })
    return f'{head[:-1]}, "meta": {request.meta}}}'


#: The SQLSTATE of akadze.refuse (a workflow waiting on a job that cannot succeed).
REFUSED = "AKZ01"


def _refused(exc: psycopg.Error) -> Exception:
    """``UpstreamFailed`` for akadze.refuse's error; any other error as it is."""
    if exc.sqlstate == REFUSED:
        return UpstreamFailed(exc.diag.message_primary or "a workflow job would wait on a "
                              "job that cannot succeed")
    return exc
