"""JSON in and out of the queue, the way Celery's ``json`` serializer does it.

Arguments, results and ``update_state`` metadata go through ``kombu.utils.json``, so
``datetime``, ``date``, ``time``, ``UUID``, ``Decimal`` and ``bytes`` come back as the same
types, exactly as they do between a Celery client and worker (``bytes`` holding a NUL byte
are written base64, kombu's form for bytes that are not UTF-8: Postgres cannot store U+0000
in text, and every kombu decodes that form). Two things are stricter than
Celery: NaN and Infinity are refused (Postgres' jsonb cannot store them), and only JSON is
spoken at all: ``pickle``, ``yaml`` and ``msgpack`` are refused with a clear error. Nothing is
ever unpickled.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from kombu.utils import json as kombu_json

from akadze_core.integration import extends_strict_dumps, strict_dumps

from .exceptions import ImproperlyConfigured

__all__ = ["check_accept_content", "check_serializer", "dumps", "loads", "revive"]

#: Names (and content types) that mean JSON in Celery's settings and call options.
JSON_NAMES = frozenset({"json", "application/json"})

_REFUSED = {
    "pickle": "pickle lets whoever can write a job run any code in your workers",
    "application/x-python-serialize": "pickle lets whoever can write a job run any code "
                                      "in your workers",
    "yaml": "only JSON is supported",
    "application/x-yaml": "only JSON is supported",
    "msgpack": "only JSON is supported",
    "application/x-msgpack": "only JSON is supported",
}


class _Encoder(kombu_json.JSONEncoder):
    """kombu's encoder, except that ``bytes`` holding a NUL byte are written in kombu's other
    form for bytes, base64 (kombu writes them as text, with U+0000, which Postgres cannot
    store). Every kombu decodes both forms back to the same bytes."""

    def default(self, o: Any) -> Any:
        if isinstance(o, bytes) and b"\x00" in o:
            return {"__type__": "base64", "__value__": base64.b64encode(o).decode("ascii")}
        return super().default(o)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (Postgres cannot store it)")


@extends_strict_dumps
def dumps(value: Any) -> str:
    """Encode ``value`` as compact JSON with kombu's type markers; NaN/Infinity refused."""
    # The engine's strict_dumps is the stdlib's encoder with these options, made once.
    # kombu's encoder differs from it only in its default(), which the C encoder calls for
    # objects of no JSON type: for plain JSON values both write the same text. kombu's
    # dumps builds a new encoder per call (about a third of a plain delay()'s Python time),
    # so plain values take the engine's and only a TypeError (some datetime, UUID,
    # Decimal...) goes to kombu's.
    try:
        return strict_dumps(value)
    except TypeError:  # a type only kombu's default() knows, or an error kombu raises too
        return kombu_json.dumps(value, cls=_Encoder, allow_nan=False, ensure_ascii=False,
                                separators=(",", ":"))


def _strict_json_loads(text: str, **kwargs: Any) -> Any:
    return json.loads(text, parse_constant=_refuse_constant, **kwargs)


_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
# Its C scanner alone: decode() around it adds two whitespace regex matches and a Python
# call chain, most of the time of a job's small args (the worker decodes them per job).
_STRICT_SCAN = _STRICT_DECODER.scan_once  # type: ignore[attr-defined]


def _strict_decode(text: str) -> Any:
    """``_STRICT_DECODER.decode(text)``: the same value, or the same error. One value with
    nothing around it (what the jobs table gives) is scanned directly; any other text
    (whitespace, extra data, not JSON) goes through ``decode``."""
    try:
        value, end = _STRICT_SCAN(text, 0)
    except StopIteration:  # leading whitespace, empty, or no JSON value here
        return _STRICT_DECODER.decode(text)
    if end != len(text):
        return _STRICT_DECODER.decode(text)
    return value


def loads(text: str | bytes) -> Any:
    """Decode JSON written by :func:`dumps` (or by Celery), reviving kombu's typed values."""
    # kombu's object_hook (Python, called for every object decoded) only changes objects
    # whose keys are exactly __type__ and __value__. A text in which "__type__" appears
    # neither as such nor spelled with \u escapes holds no such object, so the stdlib's
    # decoder alone returns the same value: the common case for args, meta and results.
    if type(text) is str and "__type__" not in text and "\\u" not in text:
        return _strict_decode(text)
    return kombu_json.loads(text, _loads=_strict_json_loads)


def revive(value: Any) -> Any:
    """Apply kombu's type markers to an already-decoded JSON value.

    Values read from jsonb columns by psycopg arrive as plain dicts; this turns
    ``{"__type__": "datetime", "__value__": "..."}`` back into a ``datetime`` (bottom up,
    like ``json.loads`` with kombu's ``object_hook``).
    """
    if isinstance(value, list):
        return [revive(item) for item in value]
    if isinstance(value, dict):
        return kombu_json.object_hook({key: revive(item) for key, item in value.items()})
    return value


def check_serializer(name: str | None, setting: str = "task_serializer") -> str:
    """Return ``"json"`` if ``name`` means JSON (or is None); raise ImproperlyConfigured if not.

    ``setting`` names the setting or option the value came from, for the error message.
    """
    if name is None or str(name).lower() in JSON_NAMES:
        return "json"
    why = _REFUSED.get(str(name).lower(), "only JSON is supported")
    raise ImproperlyConfigured(
        f"{setting}={name!r} is not supported by akadze_compat: {why}. Use {setting}='json' "
        "(kombu's JSON round-trips datetime, date, time, UUID, Decimal and bytes); pass "
        "other objects as JSON-friendly values such as ids."
    )


def check_accept_content(values: Iterable[str] | str | None, setting: str = "accept_content") \
        -> list[str]:
    """Check an ``accept_content`` style list: every entry must mean JSON."""
    if values is None:
        return ["json"]
    if isinstance(values, str):
        values = [values]
    return [check_serializer(value, setting) for value in values]
