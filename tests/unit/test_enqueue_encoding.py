"""The enqueue path's shortcuts around ``encode_args`` must give exactly its results and its
errors: the bulk path's JSON arrays (one ``dumps`` per chunk of jobs) and the single path's
parameters built without a ``JobRequest``. Pure functions: no database needed."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

import pytest

from akadze_core import App, InvalidArgs
from akadze_core.enqueue.encoding import BULK_CHUNK, encode_fast, encode_many, storable
from akadze_core.model.serialization import encode_args, extends_strict_dumps, strict_dumps

VALUES: list[dict[str, Any]] = [
    {}, {"n": 1}, {"s": "plain"}, {"unicode": "😀 ünï 日本", "é": "clé"},
    {"escaped": "\\u0000", "backslashes": "\\\\u0000", "quote": "'\"", "tab": "a\tb\nc"},
    {"nested": {"list": [1, 2.5, None, True, {"deep": []}]}}, {"big": 10**30},
    {"pair": "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16")},
]

BAD: dict[str, Any] = {
    "set": {"x": {1, 2}},
    "object": {"x": [1, {"y": object()}]},
    "nan": {"x": float("nan")},
    "nul": {"x": "a\x00b"},
    "nul key": {"a\x00b": 1},
    "escaped backslash then nul": {"v": "\\\x00"},
    "lone surrogate": {"x": "\ud800"},
    "surrogate key": {"\udc00": 1},
    "int key": {1: "a"},
    "str and int keys": {"ok": 1, 2: "b"},
    "none key": {None: 1},
}


def per_job(batch: list[Any], dumps: Any = strict_dumps, limit: int = 1 << 20) -> list[str]:
    """What the bulk path did before chunks: encode_args on each job."""
    return [encode_args(dict(kwargs), dumps, limit) for kwargs in batch]


def error_of(call: Any) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as raised:
        call()
    return type(raised.value), str(raised.value)


def outcome_of(call: Any) -> Any:
    """The value ``call()`` returns, or the type and message of what it raises."""
    try:
        return call()
    except Exception as exc:
        return type(exc), str(exc)


def test_chunks_hold_exactly_the_per_job_texts_in_order() -> None:
    batch = [dict(VALUES[i % len(VALUES)], i=i) for i in range(2 * BULK_CHUNK + 7)]
    arrays = encode_many(batch)
    assert len(arrays) == 3
    texts = per_job(batch)
    assert arrays == ["[" + ",".join(texts[start:start + BULK_CHUNK]) + "]"
                      for start in range(0, len(batch), BULK_CHUNK)]
    assert [item for array in arrays for item in json.loads(array)] == batch
    assert encode_many([]) == [] and encode_many(iter(batch[:3])) == encode_many(batch[:3])


@pytest.mark.parametrize("position", [0, 1, BULK_CHUNK - 1, BULK_CHUNK, 2 * BULK_CHUNK + 6])
@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_a_bad_job_anywhere_raises_what_encode_args_raises(bad: Any, position: int) -> None:
    batch: list[Any] = [{"i": i} for i in range(2 * BULK_CHUNK + 7)]
    batch[position] = bad
    expected = error_of(lambda: encode_args(dict(bad)))
    assert expected[0] is InvalidArgs
    assert error_of(lambda: encode_many(batch)) == expected


def test_the_first_bad_job_is_the_one_reported() -> None:
    batch: list[Any] = [{"i": i} for i in range(BULK_CHUNK * 2)]
    batch[BULK_CHUNK + 3] = {"x": "\ud800"}
    batch[BULK_CHUNK + 50] = {"x": {1}}
    assert "surrogate" in error_of(lambda: encode_many(batch))[1]
    batch[5] = {"x": "a\x00"}
    assert "NUL" in error_of(lambda: encode_many(batch))[1]


@pytest.mark.parametrize("bad", [[1, 2], "text", None, 1, ({"a": 1},)])
def test_what_dict_cannot_convert_fails_as_it_did(bad: Any) -> None:
    batch: list[Any] = [{"i": 1}, bad, {"i": 2}]
    assert error_of(lambda: encode_many(batch)) == error_of(lambda: per_job(batch))


def test_other_mappings_and_pairs_are_accepted_as_before() -> None:
    batch: list[Any] = [MappingProxyType({"a": 1}), OrderedDict(b=2), [("c", 3)], {"d": 4}]
    assert [item for array in encode_many(batch) for item in json.loads(array)] == \
        [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]


def test_the_size_limit_applies_to_each_job_not_to_the_chunk() -> None:
    limit = len('{"v":"' + "x" * 40 + '"}')  # 48 bytes
    fits = [{"v": "x" * 40}] * (BULK_CHUNK + 1)  # each exactly at the limit, chunks far over
    assert encode_many(fits, strict_dumps, limit) == \
        ["[" + ",".join(per_job(fits[:BULK_CHUNK], limit=limit)) + "]",
         "[" + per_job(fits[:1], limit=limit)[0] + "]"]
    over = [*fits[:10], {"v": "x" * 41}, *fits[:10]]
    assert error_of(lambda: encode_many(over, strict_dumps, limit)) == \
        (InvalidArgs, f"job arguments are 49 bytes, over the limit of {limit} bytes")
    # UTF-8 bytes, not characters: 20 "é" are 40 bytes.
    assert json.loads(encode_many([{"v": "é" * 20}], strict_dumps, limit)[0]) == [{"v": "é" * 20}]
    with pytest.raises(InvalidArgs, match="50 bytes"):
        encode_many([{"v": "é" * 21}] * 3, strict_dumps, limit)


def test_a_custom_dumps_is_called_per_job_and_checked_the_same() -> None:
    calls: list[Any] = []

    def dumps(value: Any) -> str:
        calls.append(value)
        return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)

    batch = [dict(VALUES[i % len(VALUES)], i=i) for i in range(BULK_CHUNK + 5)]
    arrays = encode_many(batch, dumps)
    assert all(isinstance(value, dict) for value in calls)  # never the whole chunk
    assert [item for array in arrays for item in json.loads(array)] == batch
    for bad in BAD.values():  # this dumps accepts NaN: then both accept it
        with_bad = [*batch[:3], bad]
        joined = outcome_of(lambda b=with_bad: ",".join(per_job(b, dumps)))
        assert outcome_of(lambda b=with_bad: encode_many(b, dumps)) == \
            (["[" + joined + "]"] if isinstance(joined, str) else joined)


# --- single enqueue: the parameters built without a JobRequest -------------------------------


def options_of(app: App) -> list[Any]:
    @app.task("t.plain", queue="q", max_attempts=4, priority=2)
    def plain(**kwargs: Any) -> None: ...

    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    return [
        plain,
        plain.configure(delay=timedelta(seconds=5), queue="other", priority=-1),
        plain.configure(at=datetime(2030, 1, 1), expires_at=datetime(2031, 1, 1)),
        plain.configure(at=at, expires_at=at, max_attempts=9, unique_key="k"),
        plain.configure(meta={"task_id": "x", "nested": {"é": [1, None]}}),
        plain.configure(meta=MappingProxyType({"a": 1}), unique_key=""),
    ]


@pytest.mark.parametrize("kwargs", VALUES)
def test_insert_params_are_the_requests_params(kwargs: Mapping[str, Any]) -> None:
    app = App("postgresql://nobody@127.0.0.1:1/unused")  # never connects here
    for call in options_of(app):
        assert call._insert_params(kwargs) == call.request(kwargs).params()


def test_insert_params_refuse_what_encode_args_refuses() -> None:
    app = App("postgresql://nobody@127.0.0.1:1/unused", max_args_bytes=20)
    call = options_of(app)[0]
    for bad in [*BAD.values(), {"v": "x" * 20}]:
        assert error_of(lambda b=bad: call._insert_params(b)) == \
            error_of(lambda b=bad: encode_args(dict(b), strict_dumps, 20))
    with pytest.raises(InvalidArgs, match="NUL"):
        call.configure(meta={"m": "\x00"})._insert_params({})


class _Key(str):
    """A str subclass: not a plain str key, so encode_args decides."""


@pytest.mark.parametrize("args", [*VALUES, *BAD.values(), {_Key("k"): 1},
                                  {"a": 1, _Key("b"): 2}, {"v": "x" * 50}])
def test_the_single_path_encodes_and_refuses_as_encode_args(args: dict[Any, Any]) -> None:
    assert outcome_of(lambda: encode_fast(args, strict_dumps, 40)) == \
        outcome_of(lambda: encode_args(dict(args), strict_dumps, 40))


def test_the_single_path_asks_an_extending_encoder_only_what_strict_dumps_cannot() -> None:
    calls: list[Any] = []

    @extends_strict_dumps
    def dumps(value: Any) -> str:  # strict_dumps, and datetimes as text (what kombu adds)
        calls.append(value)
        try:
            return strict_dumps(value)
        except TypeError:
            return json.dumps(value, default=str, separators=(",", ":"), allow_nan=False)

    for args in [*VALUES, {"at": datetime(2030, 1, 1)}, *BAD.values(), {"v": "x" * 500}]:
        calls.clear()
        fast = outcome_of(lambda a=args: encode_fast(a, dumps, 400))
        asked = list(calls)
        assert fast == outcome_of(lambda a=args: encode_args(dict(a), dumps, 400))
        if args in VALUES and storable(strict_dumps(args), 400):
            assert asked == []  # its text is strict_dumps', without the call
    calls.clear()
    assert encode_fast({"at": datetime(2030, 1, 1)}, dumps, 40) == '{"at":"2030-01-01 00:00:00"}'
    assert calls  # encoded by the encoder itself
