"""Classify how a run ended into the outcome the completer writes (pure, no database)."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from psycopg import sql

from . import dsn
from .errors import (
    JobOutcome,
    JobTimeout,
    ResultNotJson,
    ResultTooLarge,
    UnstorableOutcome,
)
from .retry import CANCEL as CANCEL  # the outcome kinds are the retry rule's, named here too
from .retry import FAIL, RETRY, SNOOZE, BackoffPolicy, backoff_delay, decide_retry
from .serialization import (
    DEFAULT_MAX_RESULT_BYTES,
    check_storable,
    is_strict,
    sanitize_text,
    strict_dumps,
)

#: An exception's arguments bigger than this (as JSON) are left out of its errors entry: the
#: message and traceback still say what happened.
ARGS_LIMIT = 8192

SUCCESS = "success"
#: A run claimed ahead and dropped before its body started, on hearing of a cancel request
#: or its expiry: the database ends it cancelled (or, not expired on its clock after all,
#: queued again), the attempt given back either way.
UNSTARTED = "unstarted"


@dataclass(frozen=True, slots=True, init=False)
class Outcome:
    """What to write for one run: ``kind`` is one of success, retry, snooze, fail, cancel,
    unstarted.

    ``retry`` spends the attempt (out of attempts it becomes failed in SQL, where the row's
    attempt count is known for sure); ``snooze`` gives the attempt back.
    """

    job_id: int
    run_count: int
    kind: str
    result: str | None = None
    delay: float = 0.0
    error: str | None = None
    #: Raise the job's attempt budget to at least this before deciding (``Retry``).
    max_attempts: int | None = None
    #: The claim's fencing token (the row's ``claim_token``), checked with ``run_count``:
    #: without the token the run was claimed with, the write changes nothing. Last, so a
    #: process child's answer (every field in order) carries it.
    claim_token: int | None = None

    # The frozen dataclass's own __init__ sets each field through object.__setattr__ (its
    # __setattr__ refuses): 1.0 µs an outcome, one per job. Each slot's descriptor sets it
    # directly (0.6 µs); the same fields, defaults and order, and still frozen after.
    def __init__(self, job_id: int, run_count: int, kind: str, result: str | None = None,
                 delay: float = 0.0, error: str | None = None,
                 max_attempts: int | None = None, claim_token: int | None = None) -> None:
        _set_job_id(self, job_id)
        _set_run_count(self, run_count)
        _set_kind(self, kind)
        _set_result(self, result)
        _set_delay(self, delay)
        _set_error(self, error)
        _set_max_attempts(self, max_attempts)
        _set_claim_token(self, claim_token)


(_set_job_id, _set_run_count, _set_kind, _set_result, _set_delay, _set_error, _set_max_attempts,
 _set_claim_token) = (vars(Outcome)[item.name].__set__ for item in fields(Outcome))


def error_entry(exc: BaseException, type_name: str | None = None,
                redact: Callable[[str], str] | None = None) -> str:
    """The JSON of one ``errors`` entry; the database adds attempt and time.

    ``raise Fail(...) from error`` (or Retry) records the error it was raised from: its
    type, module, message and traceback, with the outcome's own message as ``reason``.
    ``redact`` scrubs the texts and arguments stored (the app's ``redact``, which knows its
    database password); without it, DSN-shaped passwords are scrubbed all the same.
    """
    # Scrubbed as it is stored: the row is shown by ``akadze jobs show``, the dashboard
    # and ``AsyncResult.result``, none of which knows the worker's password.
    scrub = redact or dsn.redact
    source = exc
    if isinstance(exc, JobOutcome) and exc.__cause__ is not None:
        source = exc.__cause__
    formatted = "".join(traceback.format_exception(type(source), source, source.__traceback__))
    # Every text is sanitized, the type's too: a class may claim any ``__module__`` (NULs,
    # lone surrogates), and one unstorable entry must not fail the whole outcome write.
    entry: dict[str, Any] = {
        "type": sanitize_text(type_name or type(source).__name__),
        "module": sanitize_text(str(type(source).__module__)),
        "message": scrub(sanitize_text(str(source))),
        "traceback": scrub(sanitize_text(formatted)),
    }
    if source is not exc:
        entry["reason"] = scrub(sanitize_text(str(exc)))
    args = _storable_args(source.args, scrub)
    if args is not None and args != [entry["message"]]:
        # What the exception was built with, for a reader rebuilding it by class and
        # arguments (Celery's exc_message) rather than from its message alone.
        entry["args"] = args
    return strict_dumps(entry)


def _storable_args(args: Any, scrub: Callable[[str], str]) -> list[Any] | None:
    """An exception's ``args`` as JSON an entry can hold: each kept when it encodes and
    Postgres can store it, else its ``repr``; every text in them scrubbed; None when there
    are none, or too many."""
    if not isinstance(args, tuple) or not args:
        return None
    kept: list[Any] = []
    for arg in args:
        if isinstance(arg, str):
            kept.append(scrub(sanitize_text(arg)))
            continue
        try:
            check_storable(strict_dumps(arg), "the arguments")
        except Exception:  # not JSON (TypeError, ValueError, RecursionError...) or a NUL
            try:
                kept.append(scrub(sanitize_text(repr(arg))))
            except Exception:
                kept.append(f"<unrepresentable {type(arg).__name__}>")
        else:
            kept.append(dsn.redact_json(arg, scrub))
    try:
        if len(strict_dumps(kept)) > ARGS_LIMIT:
            return None
    except Exception:  # a dict with keys that encode but do not round-trip
        return None
    return kept


#: Characters of an error's message in a log line; the whole text stays in ``errors``.
SUMMARY_LIMIT = 500


def error_summary(entry: dict[str, Any], redact: Callable[[str], str] = str,
                  limit: int = SUMMARY_LIMIT) -> str:
    """``Type: message`` of an ``errors`` entry, for a log line: one line, redacted, at most
    about ``limit`` characters. ``Fail(...) from error`` adds its own reason in brackets."""
    kind = entry.get("type") or "Error"
    message = entry.get("message") or ""
    reason = entry.get("reason")
    text = f"{kind}: {message}" if message else str(kind)
    if reason and reason != message:
        text = f"{text} ({reason})"
    # Redacted before it is cut: a cut could leave a password's start unrecognizable.
    text = " ".join(redact(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def parse_error(error: str | None) -> dict[str, Any]:
    """The ``errors`` entry an outcome carries as JSON text ({} when it has none)."""
    if not error:
        return {}
    try:
        entry = json.loads(error)
    except ValueError:
        return {"message": error}
    return entry if isinstance(entry, dict) else {"message": str(entry)}


def succeeded(
    job_id: int, run_count: int, attempt: int, value: Any,
    policy: BackoffPolicy | None, dumps: Callable[[Any], str] = strict_dumps,
    max_bytes: int = DEFAULT_MAX_RESULT_BYTES, *, claim_token: int | None = None,
) -> Outcome:
    """The outcome of a body that returned ``value``: a result that can never be stored (a
    NUL, a lone surrogate, over ``max_bytes`` as JSON) fails the job, with no retry
    (``claim_token``: the run's, see ``Outcome``)."""
    if value is None and max_bytes >= 4 and (dumps is strict_dumps or is_strict(dumps)):
        # Most bodies return nothing: "null", which the checks below always let through
        # (an encoder extending strict_dumps, the Celery facade's, gives the same text).
        # The core's own encoder is recognized without is_strict's call.
        return Outcome(job_id, run_count, SUCCESS, claim_token=claim_token, result="null")
    try:
        text = dumps(value)
    except Exception as exc:  # TypeError, ValueError, RecursionError, an encoder's own error
        error = ResultNotJson(f"the task returned a value that is not JSON: {exc}")
        return Outcome(job_id, run_count, RETRY, delay=backoff_delay(policy, attempt),
                       error=error_entry(error), claim_token=claim_token)
    refusal = result_refusal(text, max_bytes)
    if refusal is not None:
        return Outcome(job_id, run_count, FAIL, error=error_entry(refusal),
                       claim_token=claim_token)
    return Outcome(job_id, run_count, SUCCESS, claim_token=claim_token, result=text)


def result_refusal(text: str, max_bytes: int) -> UnstorableOutcome | None:
    """Why the encoded result ``text`` can never be stored (None: it can): a NUL or a lone
    surrogate (``UnstorableOutcome``), or more than ``max_bytes`` bytes of UTF-8
    (``ResultTooLarge``). Checked where the result is encoded, before it reaches a process
    pool's pipe or a batched write, which a value Postgres refuses would fail whole."""
    # A character takes one to four bytes: len() alone decides most texts, without encoding.
    if len(text) > max_bytes:
        return ResultTooLarge(f"the result is over {max_bytes} bytes as JSON, the limit "
                              "(max_result_bytes)")
    try:
        check_storable(text, "the result")
    except ValueError as exc:
        return UnstorableOutcome(str(exc))
    if len(text) * 4 > max_bytes and not text.isascii():
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            return ResultTooLarge(f"the result is {size} bytes as JSON, over the limit of "
                                  f"{max_bytes} bytes (max_result_bytes)")
    return None


def raised(
    job_id: int, run_count: int, attempt: int, exc: BaseException, policy: BackoffPolicy | None,
    redact: Callable[[str], str] | None = None, *, claim_token: int | None = None,
) -> Outcome:
    """The outcome of a body that raised ``exc``; ``redact`` scrubs its error entry (see
    ``error_entry``); ``claim_token``: the run's, see ``Outcome``."""
    # The decision is the retry module's (decide_retry); out of attempts, a retry becomes
    # failed in SQL on the row's own counts (see akadze_core.model.retry).
    decision = decide_retry(exc, attempt, None, policy)
    if decision.kind == SNOOZE:
        return Outcome(job_id, run_count, SNOOZE, claim_token=claim_token, delay=decision.delay)
    type_name = "JobTimeout" if isinstance(exc, JobTimeout) else None
    return Outcome(job_id, run_count, decision.kind, delay=decision.delay,
                   error=error_entry(exc, type_name, redact),
                   max_attempts=decision.max_attempts, claim_token=claim_token)


#: A statement an ``OutcomeWriter`` runs: SQL text or a ``psycopg.sql`` composition.
Statement = str | sql.SQL | sql.Composed


class OutcomeWriter(Protocol):
    """Writes something of its own about stored outcomes, in their own transaction (a
    framework's copy of a task's result in its table, as Celery's result backends keep one):
    either both are committed or neither is.

    ``select`` is run with ``{"ids": [the jobs the write changed]}`` after the outcomes are
    written; ``statement`` turns its rows (dicts) into the statement and parameters to run
    then, or None for nothing. An app with no writer pays nothing (no transaction block, no
    query)."""

    @property
    def select(self) -> Statement:
        """The query of the rows ``statement`` is given (parameter ``ids``)."""
        ...

    def statement(self, rows: list[dict[str, Any]]) -> tuple[Statement, dict[str, Any]] | None:
        """The statement that records ``rows`` (None: nothing to record)."""
        ...
