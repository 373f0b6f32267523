"""kombu JSON in and out: Celery's types round-trip, NaN and non-JSON serializers refused."""

from __future__ import annotations

import enum
import json
import math
import uuid
from datetime import date, datetime, time, timezone
from decimal import Decimal

import pytest
from kombu.utils import json as kombu_json

from akadze_compat.exceptions import ImproperlyConfigured
from akadze_compat.serialization import (
    check_accept_content,
    check_serializer,
    dumps,
    loads,
    revive,
)

VALUES = [
    datetime(2024, 5, 17, 12, 30, 5, 123456, tzinfo=timezone.utc),
    datetime(2024, 5, 17, 12, 30),
    date(2024, 5, 17),
    time(12, 30, 5),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    Decimal("3.14159265358979323846"),
    b"raw bytes",
    b"\xff\x00\xfe",
    {"nested": [1, "two", None, True, {"when": datetime(2020, 1, 1)}]},
    "unicode ✓ text",
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_keeps_celery_types(value: object) -> None:
    assert loads(dumps(value)) == value
    assert type(loads(dumps(value))) is type(value)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_same_encoding_as_kombu(value: object) -> None:
    # What a Celery client sends decodes here and the other way round.
    assert loads(kombu_json.dumps(value)) == value
    assert kombu_json.loads(dumps(value)) == value


@pytest.mark.parametrize("value", [b"\x00\x01", b"\x00", [b"a\x00b", {"k": b"\x00"}],
                                   {"when": date(2024, 5, 17), "raw": b"\x00z"}], ids=repr)
def test_bytes_holding_nul_round_trip_in_kombus_base64_form(value: object) -> None:
    # kombu writes UTF-8 bytes as text, and U+0000 cannot be stored by Postgres: such bytes
    # go in kombu's other form for bytes, base64, which every kombu decodes.
    text = dumps(value)
    assert "\\u0000" not in text and "\x00" not in text and '"__type__":"base64"' in text
    assert loads(text) == value and kombu_json.loads(text) == value


def test_a_string_holding_nul_is_not_changed_into_bytes() -> None:
    assert loads(dumps("a\x00b")) == "a\x00b"  # text: refused where it is stored, as before


class _Reduced:
    """An object kombu encodes through its ``__json__`` method."""

    def __json__(self) -> dict[str, int]:
        return {"reduced": 1}

    def __repr__(self) -> str:
        # The test id: the same in every process (pytest-xdist's workers compare them).
        return "_Reduced()"


class _Number(enum.IntEnum):
    ONE = 1


class _Text(str):
    pass


PLAIN_VALUES = [{"a": [1, 2.5, None, True, "é ✓"]}, {1: "int key", 2.5: "float key"},
                [_Number.ONE, _Text("text subclass")], (1, 2), {"deep": {"er": [[], {}]}}]


@pytest.mark.parametrize("value", [*VALUES, *PLAIN_VALUES, _Reduced(), [_Reduced()]], ids=repr)
def test_the_text_is_exactly_kombus(value: object) -> None:
    # dumps() takes the stdlib's encoder first and kombu's only for types that need it:
    # the text must not depend on which one wrote it.
    assert dumps(value) == kombu_json.dumps(value, allow_nan=False, ensure_ascii=False,
                                            separators=(",", ":"))


@pytest.mark.parametrize("text", [
    '{"args": [1, "two"], "kwargs": {"x": null}}', '[]', '"plain"', '{"a": {"b": [{}]}}',
    '{"when": {"__type__": "datetime", "__value__": "2024-05-17T12:30:00"}}',
    '{"\\u005f_type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678"}}',
    '{"\\u00e9t\\u00e9": 1}', '{"__type__": "kept", "other": 1}',
])
def test_loads_decodes_exactly_as_kombu(text: str) -> None:
    # loads() skips kombu's object_hook when no object can carry a type marker: the value
    # must not depend on which path decoded it (markers spelled with escapes included).
    decoded = loads(text)
    assert decoded == kombu_json.loads(text)
    assert type(decoded) is type(kombu_json.loads(text))


def _refuse(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (Postgres cannot store it)")


def test_loads_gives_what_the_strict_json_decoder_gives_value_or_error() -> None:
    # The plain path scans the text with the C scanner alone, falling back to the whole
    # decoder for whitespace or extra data: the value or the error must be the same.
    texts = ['{"args": [0], "kwargs": {}}', ' {"n":1}', '{"n":1} ', '{"n":1}x', "", "nul",
             "\ufeff{}", "[1,2", '"\\ud800"', "1e400", "NaN", "[1, -Infinity]", "  ", "0",
             '{"a": {"b": [1, 2.5, null, true]}}', '{"a": 1, "a": 2}', '{"a":}', "-",
             '"abc', "[] []", "\n[1]\n"]

    def outcome(text: str) -> str:
        try:
            return repr(loads(text))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def strict(text: str) -> str:
        try:
            return repr(json.JSONDecoder(parse_constant=_refuse).decode(text))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    for text in texts:
        assert outcome(text) == strict(text), text


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity, "__type__": 1}'])
def test_nan_is_refused_on_both_decoding_paths(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, math.nan]])
def test_nan_and_infinity_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        dumps(value)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}'])
def test_nan_is_refused_when_reading(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


def test_unknown_objects_are_refused() -> None:
    with pytest.raises(TypeError):
        dumps(object())
    with pytest.raises(TypeError):
        dumps({1, 2})


def test_revive_applies_markers_to_decoded_values() -> None:
    when = datetime(2024, 1, 2, tzinfo=timezone.utc)
    plain = kombu_json.loads(dumps({"when": when}), object_hook=None)
    assert plain == {"when": {"__type__": "datetime", "__value__": when.isoformat()}}
    assert revive(plain) == {"when": when}
    assert revive([plain, 1]) == [{"when": when}, 1]


def test_loads_never_unpickles() -> None:
    import pickle

    blob = pickle.dumps({"a": 1})
    with pytest.raises((ValueError, UnicodeDecodeError)):
        loads(blob)


@pytest.mark.parametrize("name", ["json", "JSON", "application/json", None])
def test_json_is_accepted(name: str | None) -> None:
    assert check_serializer(name) == "json"


@pytest.mark.parametrize("name", ["pickle", "yaml", "msgpack", "application/x-python-serialize",
                                  "custom"])
def test_other_serializers_are_refused_clearly(name: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="task_serializer='json'"):
        check_serializer(name)


def test_pickle_message_says_why() -> None:
    with pytest.raises(ImproperlyConfigured, match="run any code"):
        check_serializer("pickle")


def test_accept_content() -> None:
    assert check_accept_content(["json", "application/json"]) == ["json", "json"]
    assert check_accept_content("json") == ["json"]
    with pytest.raises(ImproperlyConfigured, match="accept_content"):
        check_accept_content(["json", "pickle"])
