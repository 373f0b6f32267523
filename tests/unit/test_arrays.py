"""Array literals (``akadze_core.store.arrays``) read back by Postgres as the same values:
quotes, backslashes, braces, commas, blanks, non-ASCII and the JSON text ``null`` (never
read as ``NULL``), as psycopg's own dump of the lists would have sent them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from akadze_core.store.arrays import float_array, int_array, text_array

TEXTS: list[list[str | None]] = [
    ["null", "NULL", "", " padded ", "é ✓", "a\nb\tc", "{}", "[1, 2]", "a,b"],
    ['"quoted"', "back\\slash", '{"a": "b\\\\c"}', 'x","y', "\\", '"'],
    ["null"] * 5,
    [None] * 4,
    [None, "null", None, ""],
    ["only"],
    [],
]


@pytest.fixture(scope="module")
def connection(admin_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("values", TEXTS)
def test_text_arrays_read_back_as_sent(connection: psycopg.Connection[Any],
                                       values: list[str | None]) -> None:
    row = connection.execute("SELECT %s::text[]", (text_array(values),)).fetchone()
    assert row is not None and row[0] == values


@pytest.mark.parametrize("values", [[1, 2**62, -(2**63)], [None, 7, None], [None], [],
                                    [True, False]])
def test_int_arrays_read_back_as_sent(connection: psycopg.Connection[Any],
                                      values: list[int | None]) -> None:
    row = connection.execute("SELECT %s::bigint[]", (int_array(values),)).fetchone()
    assert row is not None
    assert row[0] == [None if value is None else int(value) for value in values]


def test_float_arrays_read_back_to_the_same_doubles(
        connection: psycopg.Connection[Any]) -> None:
    values = [0.0, 1e-05, 0.1, 2 / 3, 123456.789, 1e300, 5e-324, -0.5, math.inf, 7]
    row = connection.execute("SELECT %s::float8[]", (float_array(values),)).fetchone()
    assert row is not None and row[0] == [float(value) for value in values]


def test_a_nul_fails_the_statement_as_psycopg_dumps_do(
        connection: psycopg.Connection[Any]) -> None:
    # The completer splits a batch on a data error to find the outcome that cannot be
    # stored (is_unstorable): a NUL must still raise one.
    with pytest.raises(psycopg.DataError):
        connection.execute("SELECT %s::text[]", (text_array(["fine", "a\x00b"]),))
