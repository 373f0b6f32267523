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
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..model.outcomes import Outcome
from .executor import execute_here

if TYPE_CHECKING:
    from ..app import App

__all__ = ["CHILD_ENV", "STOP", "child_number", "decode_answer", "encode_rows", "is_child",
           "serve"]

logger = logging.getLogger("akadze.worker")

#: Set in a child's environment: ``"<number>:<read fd>:<write fd>"``.
CHILD_ENV = "AKADZE_PROCESS_CHILD"
#: Tells a child to exit; end of file without it means the parent died.
STOP = b'{"stop": true}\n'
_DATETIME_FIELDS = ("scheduled_at", "expires_at", "created_at", "started_at")
# An outcome's fields, in order, as one tuple: dataclasses.astuple deep-copies every field
# (a tenth of a child's time per no-op body), and the fields are plain values anyway.
_outcome_values = operator.attrgetter(*(item.name for item in fields(Outcome)))


def _isoformat(value: Any) -> str:
    """The encoder's ``default``: a row's timestamps (``_DATETIME_FIELDS``) as ISO text."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One JSON encoder for every row, its timestamps written by ``default`` as it meets them: no
# copy of the row and no loop over its fields first (a row's encoding is most of the
# parent's cost of sending a job). ``c_make_encoder`` is the C encoder ``json.dumps`` builds
# per call; without it (another interpreter), the same encoder in Python.
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_encoder is not None:
    _encode_chunks = _c_encoder(None, _isoformat, json.encoder.encode_basestring_ascii, None,
                                ": ", ", ", False, False, True)

    def _encode(message: dict[str, Any]) -> str:
        return "".join(_encode_chunks(message, 0))
else:  # pragma: no cover - CPython has the C encoder
    _python_encoder = json.JSONEncoder(default=_isoformat, check_circular=False)

    def _encode(message: dict[str, Any]) -> str:
        return _python_encoder.encode(message)


def encode_rows(rows: Sequence[Mapping[str, Any]], worker_id: int | None,
                task_id_key: str | None = None) -> bytes:
    """The message that hands the claimed ``rows`` to a child, to run in order (with the
    database's key of derived task ids, so that the child never connects to read it).
    One message for every row written to a child at once: one encoder call and one decode
    in the child for them all, not one per row."""
    plain = [row if type(row) is dict else dict(row)  # the encoder writes plain dicts only
             for row in rows]
    return _encode({"rows": plain, "worker_id": worker_id,
                    "task_id_key": task_id_key}).encode() + b"\n"


def _decode_row(row: dict[str, Any]) -> dict[str, Any]:
    for name in _DATETIME_FIELDS:
        value = row.get(name)
        if isinstance(value, str):
            row[name] = datetime.fromisoformat(value)
    return row


def _encode_answer(took: float, outcome: Outcome | None) -> bytes:
    answer = [took, None if outcome is None else _outcome_values(outcome)]
    return json.dumps(answer).encode() + b"\n"


def decode_answer(line: bytes) -> tuple[float, Outcome | None]:
    """A child's answer: the seconds its body took, and the outcome (None: complete_tx
    wrote it)."""
    # The child's json.dumps writes ASCII: decoded here, json.loads skips its own detection
    # of the encoding of bytes (Python code, the larger part of loading a line this short).
    took, values = json.loads(line.decode())
    return float(took), None if values is None else Outcome(*values)


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
            message = json.loads(line)
            if message.get("stop"):
                break
            if message.get("task_id_key"):
                app.use_task_id_key(message["task_id_key"])
            worker_id = message["worker_id"]
            for row in message["rows"]:
                row = _decode_row(row)
                started = time.perf_counter()
                outcome = execute_here(app, row, worker_id)
                # How long the body took tells the parent which tasks are short; each answer
                # goes at once, so a body that ends its process is the one it ends.
                writer.write(_encode_answer(time.perf_counter() - started, outcome))
                writer.flush()
        else:
            # End of file without a stop message: the worker process died (SIGKILL?).
            logger.warning("the worker process (pid %s) is gone: exiting", parent)
    sys.stdout.flush()
    return 0
