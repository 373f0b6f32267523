"""Array parameters as Postgres array literals, made by ``str.join``.

psycopg dumps a Python list element by element in Python (binary or text alike): for the
outcome write, eight arrays of a batch, that was ~3.7 µs of a worker's CPU per outcome, more
than its run. The literal of the same array is made here in C (``str.join``, ``map``) but for
a pass over the elements of a text array that holds a quote or a backslash; the statement
casts it (``%(id)s::bigint[]``) and Postgres parses it.

Every element of a text array is quoted, so that no value reads as a ``NULL`` (the JSON
text ``null``), and a NUL in one fails the statement as psycopg's own dump does
(``psycopg.DataError``).
"""

from __future__ import annotations

from collections.abc import Sequence


def int_array(values: Sequence[int | None]) -> str:
    """The literal of a ``bigint[]`` or ``int[]`` (``None``: ``NULL``)."""
    if None in values:
        return "{" + ",".join(["NULL" if value is None else str(int(value))
                               for value in values]) + "}"
    return "{" + ",".join(map(str, map(int, values))) + "}"  # type: ignore[arg-type]


def float_array(values: Sequence[float]) -> str:
    """The literal of a ``float8[]``: each value's ``repr``, which Postgres reads back to the
    same double (``inf`` and ``nan`` included)."""
    return "{" + ",".join(map(repr, map(float, values))) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """The literal of a ``text[]`` (``None``: ``NULL``), every other element quoted."""
    if None not in values:
        body = '","'.join(values)  # type: ignore[arg-type]
        if "\\" not in body and '"' not in body:
            return '{"' + body + '"}' if values else "{}"
    elif values.count(None) == len(values):  # a batch without errors: its error array
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    return "{" + ",".join(["NULL" if value is None else _quoted(value) for value in values]) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = ["float_array", "int_array", "text_array"]
