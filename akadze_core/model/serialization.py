"""JSON in and out of the jobs table, with the checks Postgres' jsonb would fail on later.

Postgres rejects ``\\u0000`` and lone surrogates inside jsonb; checking here turns a late,
confusing database error into a clear one before anything is inserted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

Dumps = Callable[[Any], str]
Loads = Callable[[str], Any]

DEFAULT_MAX_ARGS_BYTES = 1024 * 1024
#: ``App(max_result_bytes=...)`` by default: a task's result, as JSON, up to 16 MiB.
DEFAULT_MAX_RESULT_BYTES = 16 * 1024 * 1024
#: The largest ``max_result_bytes``: Postgres refuses a jsonb value (and a string inside
#: one) of 256 MiB or more, and one larger result would have to cross a process pool's pipe.
MAX_RESULT_BYTES_CEILING = 256 * 1024 * 1024 - 1
#: Characters of a queue name, task name, unique key or task id. Two names share a row of
#: the fair-claim index (at most 2704 bytes in Postgres) and a queue name travels in every
#: NOTIFY payload (at most 8000 bytes): 255 characters of up to 4 bytes each fit both.
MAX_NAME_LENGTH = 255

# An escaped NUL preceded by an even number of backslashes (an odd number would mean the
# backslash itself was escaped, i.e. the text "\u0000" and not the character).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# NUL and the surrogate range: neither can be stored in a Postgres text or jsonb value.
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


# json.dumps() with any option builds a new encoder per call: made once here instead (an
# encoder keeps no state between calls), the same text for the same value.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


# The C encoder _ENCODER.encode() builds per call (with a closure and a dict of markers
# against cycles), made once: a third of a small encode's time. Without markers it holds no
# state, so threads share it; a cycle then ends in RecursionError instead of ValueError, and
# _ENCODER.encode() is asked again for that value, to raise exactly its own error.
_C_ENCODE = None if c_make_encoder is None else c_make_encoder(
    None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False)


def strict_dumps(value: Any) -> str:
    """Plain JSON, refusing NaN/Infinity and anything the json module cannot encode."""
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    try:
        return "".join(_C_ENCODE(value, 0))
    except RecursionError:
        return _ENCODER.encode(value)


# json.loads() of a str is a Python-level decode() around the C scanner: two whitespace
# regex matches and a call chain, three quarters of the time of a job's small args.
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def fast_loads(text: str) -> Any:
    """``json.loads(text)``: the same value, or the same error, for any ``text``. JSON
    text that is one value with nothing around it (what Postgres gives for a jsonb or
    json column) is scanned directly; anything else goes through ``json.loads``."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, TypeError):  # leading whitespace or a BOM, bytes, not JSON
        return json.loads(text)
    if end != len(text):  # whitespace after the value, or extra data
        return json.loads(text)
    return value


#: The dumps functions marked by ``extends_strict_dumps``.
_EXTENDING: set[Dumps] = set()


def extends_strict_dumps(dumps: Dumps) -> Dumps:
    """Mark ``dumps`` (an app's ``json_dumps``) as one that returns ``strict_dumps(value)``
    whenever that succeeds, encoding other values its own way (an encoder that only adds
    types). Bulk encoders (``enqueue_many``, ``Workflow.add_many``) then encode an array
    of jobs with one ``strict_dumps`` call, its items' texts being what ``dumps`` gives
    each, as they do for ``strict_dumps`` itself. Returns ``dumps``."""
    _EXTENDING.add(dumps)
    return dumps


def is_strict(dumps: Dumps) -> bool:
    """Whether ``dumps`` is ``strict_dumps`` or extends it (``extends_strict_dumps``)."""
    return dumps is strict_dumps or dumps in _EXTENDING


def check_storable(text: str, what: str) -> str:
    """Raise ValueError if ``text`` (encoded JSON) cannot be stored in a jsonb column."""
    if _ESCAPED_NUL.search(text) or "\x00" in text:
        raise ValueError(f"{what} contain a NUL character, which Postgres cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} contain a lone surrogate, which is not valid UTF-8") from exc
    return text


def encode_args(
    args: Any, dumps: Dumps = strict_dumps, max_bytes: int = DEFAULT_MAX_ARGS_BYTES
) -> str:
    """Encode a job's arguments, or raise ``InvalidArgs`` with a clear reason."""
    from .errors import InvalidArgs

    if not isinstance(args, dict) or not all(isinstance(key, str) for key in args):
        raise InvalidArgs("job arguments must be a mapping with string keys")
    try:
        text = dumps(args)
    except (TypeError, ValueError) as exc:
        raise InvalidArgs(f"job arguments are not JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidArgs("job arguments are not JSON: nested too deeply to encode") from exc
    try:
        check_storable(text, "job arguments")
    except ValueError as exc:
        raise InvalidArgs(str(exc)) from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidArgs(f"job arguments are {size} bytes, over the limit of {max_bytes} bytes")
    return text


def sanitize_text(text: str) -> str:
    """Make any text storable in jsonb: NULs and lone surrogates become U+FFFD."""
    return _UNSTORABLE_CHARACTER.sub("\ufffd", text)


# Names checked once already: a producer enqueues to a handful of queues over and over.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_LIMIT = 4096


def check_name(value: Any, what: str, *, key: bool = False) -> None:
    """Raise ``InvalidArgs`` unless ``value`` can name a queue or task (``what`` says which):
    a non-empty str of at most ``MAX_NAME_LENGTH`` characters with no NUL or lone
    surrogate. ``key``: a unique key or task id, which may also be None or empty."""
    if type(value) is str and value in _GOOD_NAMES:
        return
    if key and not value and (value is None or value == ""):
        return
    from .errors import InvalidArgs

    if not isinstance(value, str):
        raise InvalidArgs(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgs(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgs(f"{what} is {len(value)} characters long, over the limit of "
                          f"{MAX_NAME_LENGTH}")
    if _UNSTORABLE_CHARACTER.search(value):
        raise InvalidArgs(f"{what} contains a NUL or a lone surrogate, which Postgres "
                          "cannot store")
    if len(_GOOD_NAMES) >= _GOOD_NAMES_LIMIT:
        _GOOD_NAMES.clear()
    _GOOD_NAMES.add(str(value))
