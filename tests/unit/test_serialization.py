"""Job arguments must be JSON that Postgres' jsonb can store; anything else is a clear error at
enqueue time (``InvalidArgs``), before anything is inserted. Plus ``sanitize_text``, which makes
error messages and tracebacks storable.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from akadze_core import InvalidArgs
from akadze_core.model.serialization import (
    DEFAULT_MAX_ARGS_BYTES,
    check_storable,
    encode_args,
    fast_loads,
    sanitize_text,
    strict_dumps,
)


@pytest.mark.parametrize(
    "args",
    [{}, {"a": 1}, {"s": "text", "n": None, "b": False, "f": 1.25, "l": [1, [2, {"x": "y"}]]},
     {"unicode": "😀 ünï 日本"}, {"big": 10**30}, {"nested": {"deep": {"deeper": []}}}],
)
def test_json_args_are_accepted_and_round_trip(args: dict[str, Any]) -> None:
    text = encode_args(args)
    assert json.loads(text) == args


@pytest.mark.parametrize(
    ("args", "reason"),
    [({"s": {1, 2}}, "not JSON"), ({"s": frozenset()}, "not JSON"),
     ({"b": b"bytes"}, "not JSON"), ({"b": bytearray(b"x")}, "not JSON"),
     ({"d": datetime(2024, 1, 1)}, "not JSON"), ({"d": date(2024, 1, 1)}, "not JSON"),
     ({"d": timedelta(seconds=1)}, "not JSON"), ({"d": Decimal("1.5")}, "not JSON"),
     ({"o": object()}, "not JSON"), ({"nested": [{"d": datetime(2024, 1, 1)}]}, "not JSON"),
     ({"n": float("nan")}, "not JSON"), ({"n": float("inf")}, "not JSON"),
     ({"n": [float("-inf")]}, "not JSON")],
)
def test_non_json_values_are_rejected(args: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidArgs, match=reason):
        encode_args(args)


@pytest.mark.parametrize(
    "args",
    [{"v": "a\x00b"}, {"a\x00": 1}, {"nested": {"k": ["\x00"]}}, {"nested": {"k\x00": 1}},
     {"v": "\x00"}],
)
def test_nul_characters_in_keys_or_values_are_rejected(args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgs, match="NUL"):
        encode_args(args)


@pytest.mark.parametrize("args", [{"v": "\ud800"}, {"v": "x\udfffy"}, {"\udc00": 1},
                                  {"v": ["ok", "\ud83d"]}])
def test_lone_surrogates_are_rejected(args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgs, match="surrogate"):
        encode_args(args)


def test_a_valid_surrogate_pair_is_fine() -> None:
    assert json.loads(encode_args({"v": "\ud83d\ude00".encode("utf-16", "surrogatepass")
                                                      .decode("utf-16")})) == {"v": "😀"}


@pytest.mark.parametrize("text", ["\\u0000", "a\\u0000b", "\\\\u0000", "\\u00000"])
def test_escaped_nul_as_literal_text_is_accepted(text: str) -> None:
    """The six characters backslash-u-0-0-0-0 are ordinary text, not a NUL."""
    encoded = encode_args({"v": text, text: 1})
    assert json.loads(encoded) == {"v": text, text: 1}
    assert "\x00" not in json.loads(encoded)["v"]


def test_nul_after_an_escaped_backslash_is_still_caught() -> None:
    # A literal backslash followed by a real NUL: JSON text \\\u0000 (escaped backslash, then
    # the escape of NUL). The odd/even backslash rule must not let it through.
    with pytest.raises(InvalidArgs, match="NUL"):
        encode_args({"v": "\\\x00"})
    with pytest.raises(InvalidArgs, match="NUL"):
        encode_args({"v": "\\\\\x00"})


def test_oversize_args_are_rejected_with_the_sizes() -> None:
    with pytest.raises(InvalidArgs, match="over the limit of 100 bytes"):
        encode_args({"v": "x" * 100}, max_bytes=100)
    exact = encode_args({"v": "x" * 10}, max_bytes=len('{"v":"xxxxxxxxxx"}'))
    assert json.loads(exact) == {"v": "x" * 10}


def test_size_limit_counts_utf8_bytes_not_characters() -> None:
    text = '{"v":"ééé"}'
    assert len(text) == 11 and len(text.encode()) == 14
    with pytest.raises(InvalidArgs, match="14 bytes"):
        encode_args({"v": "ééé"}, max_bytes=13)
    assert encode_args({"v": "ééé"}, max_bytes=14) == text


def test_default_limit_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_ARGS_BYTES == 1024 * 1024
    encode_args({"v": "x" * (DEFAULT_MAX_ARGS_BYTES - 100)})
    with pytest.raises(InvalidArgs, match="over the limit"):
        encode_args({"v": "x" * DEFAULT_MAX_ARGS_BYTES})


@pytest.mark.parametrize("args", [{1: "a"}, {None: 1}, {("t",): 1}, {"ok": 1, 2: "b"},
                                  {b"k": 1}, {1.5: 1}, {True: 1}])
def test_non_string_keys_are_rejected(args: dict[Any, Any]) -> None:
    with pytest.raises(InvalidArgs, match="string keys"):
        encode_args(args)


@pytest.mark.parametrize("args", [[1, 2], "text", None, 1, ({"a": 1},)])
def test_args_must_be_a_mapping(args: Any) -> None:
    with pytest.raises(InvalidArgs, match="mapping"):
        encode_args(args)


def test_invalid_args_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        encode_args({"s": {1}})


def test_custom_dumps_is_used() -> None:
    def dumps(value: Any) -> str:
        return json.dumps(value, default=str)

    assert json.loads(encode_args({"d": datetime(2024, 1, 1)}, dumps)) == {
        "d": "2024-01-01 00:00:00"}


def test_strict_dumps_is_compact_and_keeps_unicode() -> None:
    assert strict_dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    with pytest.raises(ValueError):
        strict_dumps(float("nan"))


def test_check_storable() -> None:
    assert check_storable('"fine"', "x") == '"fine"'
    with pytest.raises(ValueError, match="the result contain a NUL"):
        check_storable('"\\u0000"', "the result")
    with pytest.raises(ValueError, match="surrogate"):
        check_storable('"\ud800"', "the result")
    assert check_storable('"\\\\u0000"', "x") == '"\\\\u0000"'


@pytest.mark.parametrize(
    ("text", "clean"),
    [("plain", "plain"), ("a\x00b", "a\ufffdb"), ("\x00\x00", "\ufffd\ufffd"),
     ("lone \ud800 high", "lone \ufffd high"), ("lone \udfff low", "lone \ufffd low"),
     ("pair 😀 kept", "pair 😀 kept"), ("\\u0000 literal", "\\u0000 literal"), ("", "")],
)
def test_sanitize_text(text: str, clean: str) -> None:
    result = sanitize_text(text)
    assert result == clean
    result.encode("utf-8")
    assert "\x00" not in result


def test_fast_loads_gives_what_json_loads_gives_value_or_error() -> None:
    texts = ['{"n": 1}', ' {"n":1}', '{"n":1} ', '{"n":1}x', "", "nul", "\ufeff{}", "[1,2",
             '"\\ud800"', "1e400", "NaN", '{"a": {"b": [1, 2.5, null, true]}}',
             '{"a": 1, "a": 2}', b'{"x": 1}', '{"a":}', "  ", "0", "-", '"abc']

    def outcome(loads: Any, text: Any) -> str:
        try:
            return repr(loads(text))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    for text in texts:
        assert outcome(fast_loads, text) == outcome(json.loads, text), text
