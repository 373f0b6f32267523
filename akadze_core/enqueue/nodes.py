"""The pieces of a workflow: its nodes (one job each, its id once enqueued), the blocks of
nodes added in bulk by ``add_many``, and the errbacks (``OnFailure``) inserted when a job
fails."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from ..store.database import JobRequest

if TYPE_CHECKING:
    from .encoding import Rows
    from .tasks import TaskCall

__all__ = ["Block", "Node", "OnFailure"]


class Node:
    """One job of a workflow: its position in the workflow, and its id once enqueued."""

    __slots__ = ("_request", "_rows", "id", "index")

    def __init__(self, index: int, request: JobRequest | None, id: int | None = None,
                 rows: Block | None = None) -> None:
        self.index = index
        self.id = id
        self._request = request
        # A node added by add_many: its row is built from its block only when asked for.
        self._rows = rows

    @property
    def request(self) -> JobRequest:
        """The row this node inserts."""
        request = self._request
        if request is None:
            assert self._rows is not None
            request = self._request = self._rows.request(self.index)
        return request

    @property
    def position(self) -> int | None:
        """Its position in the fan-out it was added with (``add_many``'s
        ``first_position``; ``Job.position`` once inserted), else None."""
        block = self._rows
        return None if block is None else block.rows.position(self.index - block.start)

    @property
    def ref(self) -> int:
        """How the insert statement names this node (``-1`` for the first)."""
        return -(self.index + 1)

    def __repr__(self) -> str:
        return f"Node(index={self.index}, id={self.id})"


class Block:
    """Nodes added by one ``add_many``: their jobs encoded in bulk (``TaskCall.rows``), sent
    as they are unless a node of them is waited on (then node by node)."""

    __slots__ = ("_decoded", "rows", "start", "template")

    def __init__(self, rows: Rows, start: int, template: int) -> None:
        self.rows, self.start, self.template = rows, start, template
        self._decoded: dict[int, Any] = {}

    def request(self, index: int) -> JobRequest:
        """The row of node ``index`` of the workflow (one of this block's)."""
        args, meta = self.rows.job(index - self.start, self._decoded)
        return dataclasses.replace(self.rows.template, args=args, meta=meta)


class OnFailure:
    """An errback: a job inserted, in the same transaction, when the job it is attached to
    ends failed (not when it is cancelled). With ``result_arg`` the errback's task receives
    the failed job's last error entry (``{"type", "message", "traceback", ...}``) as that
    argument; ``current().job.upstreams[0]`` is the failed job's id either way."""

    __slots__ = ("pass_error", "request", "result_arg")

    def __init__(self, call: TaskCall, /, *, result_arg: str | None = None,
                 **kwargs: Any) -> None:
        self.request = call.request(kwargs, provided=() if result_arg is None
                                    else (result_arg,))
        self.result_arg = result_arg
        self.pass_error = result_arg is not None

    @classmethod
    def from_request(cls, request: JobRequest, *, pass_error: bool = True,
                     result_arg: str | None = None) -> OnFailure:
        """An errback from a request built elsewhere (integrations such as akadze_compat)."""
        errback = cls.__new__(cls)
        errback.request = request
        errback.result_arg = result_arg
        errback.pass_error = pass_error
        return errback

    def spec(self) -> str:
        """The JSON the insert statement stores in ``on_failure`` (args and meta as they are:
        already-validated JSON text)."""
        request = self.request
        if request.unique_key is not None:
            raise ValueError("an errback cannot have a unique_key")
        flow: dict[str, Any] = {}
        if self.pass_error:
            flow["pass"] = "one"
        if self.result_arg is not None:
            flow["result_arg"] = self.result_arg
        fields = {
            "task": request.task, "queue": request.queue, "priority": request.priority,
            "max_attempts": request.max_attempts, "delay": request.delay or None,
            "expires_at": request.expires_at.isoformat() if request.expires_at else None,
            "flow": flow or None,
        }
        head = json.dumps({key: value for key, value in fields.items() if value is not None})
        return f'{head[:-1]}, "args": {request.args}, "meta": {request.meta}}}'
