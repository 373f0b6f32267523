"""The child's side of the process pool (``akadze_core.execution.processes``), and their wire
format.

Parent and child talk over two pipes, one JSON line per message, so nothing is ever
unpickled: the parent sends the claimed rows it hands a child at once, in one message
(``encode_rows``), or ``STOP``; the child runs them in order and answers each row with how
long the body took and the outcome's fields (``decode_answer``).
"""

from __future__ import annotations

import json
import logging
import operator
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..model.outcomes import Outcome
from ..model.serialization import fast_loads
from .executor import execute_here

if TYPE_CHECKING:
    from ..app import App

__all__ = ["CHILD_ENV", "ROW_FIELDS", "STOP", "child_number", "decode_answer", "encode_rows",
           "is_child", "serve"]

logger = logging.getLogger("akadze.worker")

#: Set in a child's environment: ``"<number>:<read fd>:<write fd>"``.
CHILD_ENV = "AKADZE_PROCESS_CHILD"
#: Tells a child to exit; end of file without it means the parent died.
STOP = b'{"stop": true}\n'
#: The fields of a claimed row that a child reads (``execute_here``, ``JobContext``, and the
#: ``Job`` a body may ask for), in the order a row is sent in: the claim's own bookkeeping
#: (``releases``, ``notified``) stays in the parent.
ROW_FIELDS = ("id", "task", "queue", "args", "state", "priority", "scheduled_at", "attempt",
              "max_attempts", "run_count", "claim_token", "expires_at", "meta", "created_at",
              "started_at", "cancel_requested", "last_error", "upstreams", "upstream_results",
              "result_arg", "position")
_DATETIME_FIELDS = ("scheduled_at", "expires_at", "created_at", "started_at")
_row_values = operator.itemgetter(*ROW_FIELDS)
# An outcome's fields, in order, as one tuple: dataclasses.astuple deep-copies every field
# (a tenth of a child's time per no-op body), and the fields are plain values anyway.
_outcome_values = operator.attrgetter(*(item.name for item in fields(Outcome)))


def _timestamps() -> Callable[[Any], str]:
    """The encoder's ``default`` for one message: a row's timestamps (``_DATETIME_FIELDS``)
    as ISO text, each distinct one formatted once. A claim's rows share their
    ``started_at``, and a job's ``created_at`` is its ``scheduled_at`` unless it was
    delayed: formatting was most of the cost of encoding a row."""
    # By instant, with the zone it was written in: equal instants in two zones are two texts.
    texts: dict[datetime, tuple[Any, str]] = {}

    def isoformat(value: Any) -> str:
        if not isinstance(value, datetime):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        known = texts.get(value)
        if known is not None and known[0] is value.tzinfo:
            return known[1]
        text = value.isoformat()
        texts[value] = (value.tzinfo, text)
        return text

    return isoformat


# The C encoder ``json.dumps`` builds per call, built here once per message around that
# message's ``default``: no copy of the rows and no loop over their fields first. Without
# it (another interpreter), the same encoder in Python.
_c_encoder = getattr(json.encoder, "c_make_encoder", None)


def _encode(message: Any, default: Callable[[Any], Any]) -> str:
    if _c_encoder is not None:
        chunks = _c_encoder(None, default, json.encoder.encode_basestring_ascii, None,
                            ": ", ", ", False, False, True)
        return "".join(chunks(message, 0))
    return json.JSONEncoder(  # pragma: no cover - CPython has the C encoder
        default=default, check_circular=False).encode(message)


def _plain(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# A child's answers: plain values only, so one C encoder for them all (json.dumps goes
# through two Python calls and builds one per answer: most of the cost of an answer).
if _c_encoder is not None:
    _answer_chunks = _c_encoder(None, _plain, json.encoder.encode_basestring_ascii, None,
                                ":", ",", False, False, True)

    def _encode_plain(value: Any) -> str:
        return "".join(_answer_chunks(value, 0))
else:  # pragma: no cover - CPython has the C encoder
    _plain_encoder = json.JSONEncoder(separators=(",", ":"), check_circular=False)

    def _encode_plain(value: Any) -> str:
        return _plain_encoder.encode(value)


def encode_rows(rows: Sequence[Mapping[str, Any]], worker_id: int | None,
                task_id_key: str | None = None) -> bytes:
    """The message that hands the claimed ``rows`` to a child, to run in order (with the
    database's key of derived task ids, so that the child never connects to read it).
    One message for every row written to a child at once: one encoder call and one decode
    in the child for them all, not one per row.

    A claim's row goes as the list of its ``ROW_FIELDS`` values (no key repeated per row,
    nothing the child does not read); a row without all of them (one made by hand) as an
    object of those it has, so the child sees the same keys missing."""
    sent: list[Any] = []
    for row in rows:
        try:
            sent.append(_row_values(row))
        except KeyError:
            sent.append({name: row[name] for name in ROW_FIELDS if name in row})
    return _encode({"rows": sent, "worker_id": worker_id, "task_id_key": task_id_key},
                   _timestamps()).encode() + b"\n"


def _decoder() -> Callable[[Any], dict[str, Any]]:
    """A message's rows as the child runs them, read back from what ``encode_rows`` wrote
    (each distinct timestamp parsed once: the rows of a claim share theirs)."""
    times: dict[str, datetime] = {}

    def decode(sent: Any) -> dict[str, Any]:
        row: dict[str, Any] = (sent if type(sent) is dict
                               else dict(zip(ROW_FIELDS, sent, strict=True)))
        for name in _DATETIME_FIELDS:
            text = row.get(name)
            if isinstance(text, str):
                value = times.get(text)
                if value is None:
                    value = times[text] = datetime.fromisoformat(text)
                row[name] = value
        return row

    return decode


def _decode_row(row: Any) -> dict[str, Any]:
    """One row of a message, read back (``_decoder``)."""
    return _decoder()(row)


def _encode_answer(took_ns: int, outcome: Outcome | None) -> bytes:
    answer = [took_ns, None if outcome is None else _outcome_values(outcome)]
    return _encode_plain(answer).encode() + b"\n"


def decode_answer(line: bytes) -> tuple[float, Outcome | None]:
    """A child's answer: the seconds its body took (sent in nanoseconds), and the outcome
    (None: complete_tx wrote it)."""
    # The child writes one compact ASCII value and its newline: the text without the
    # newline goes to the C scanner directly (json.loads's detection of the encoding of
    # bytes and its Python layer were most of the cost of loading a line this short).
    took_ns, values = fast_loads(line[:-1].decode())
    return took_ns / 1e9, None if values is None else Outcome(*values)


def is_child() -> bool:
    """Whether this process is a pool child (its command should call ``serve``)."""
    return CHILD_ENV in os.environ


def child_number() -> int:
    """This child's number in its pool (1, 2, ...; replacements get new numbers)."""
    return int(os.environ[CHILD_ENV].split(":")[0])


def serve(app: App) -> int:
    """A pool child's life: tell the parent it is ready, then run the bodies of each
    message's rows, in order, until the parent says stop (or dies). Returns the exit code
    (0)."""
    number, read_fd, write_fd = (int(part) for part in os.environ.pop(CHILD_ENV).split(":"))
    del number
    parent = os.getppid()
    # The parent decides when children stop: Ctrl-C in a terminal is for the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb") as writer:
        writer.write(json.dumps({"ready": os.getpid()}).encode() + b"\n")
        writer.flush()
        for line in reader:
            # ASCII (``encode_rows``), read as the parent reads an answer (``decode_answer``).
            message = fast_loads(line[:-1].decode())
            if message.get("stop"):
                break
            if message.get("task_id_key"):
                app.use_task_id_key(message["task_id_key"])
            worker_id = message["worker_id"]
            decode = _decoder()
            for sent in message["rows"]:
                row = decode(sent)
                started = time.perf_counter_ns()
                outcome = execute_here(app, row, worker_id)
                # How long the body took tells the parent which tasks are short; each answer
                # goes at once, so a body that ends its process is the one it ends.
                writer.write(_encode_answer(time.perf_counter_ns() - started, outcome))
                writer.flush()
        else:
            # End of file without a stop message: the worker process died (SIGKILL?).
            logger.warning("the worker process (pid %s) is gone: exiting", parent)
    sys.stdout.flush()
    return 0
