"""Encoding jobs' arguments: ``encode_args``' results, without its cost on the common case.

``encode_args`` costs about as much per job as the bulk insert of the job itself (a regex, a full
UTF-8 encode, an import per call). The helpers here accept only text that encode_args would
return as is and hand everything else to encode_args itself, so the results and the errors
stay exactly its.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from itertools import chain
from typing import Any

from ..model.errors import InvalidArgs
from ..model.serialization import (
    DEFAULT_MAX_ARGS_BYTES,
    Dumps,
    encode_args,
    is_strict,
    strict_dumps,
)
from ..store.database import JobRequest

#: Jobs per JSON array in a bulk insert: one dumps() call per array, and an array at most
#: max_args_bytes long proves every job in it fits (see _encode_chunk).
BULK_CHUNK = 100


def storable(text: Any, limit: int) -> bool:
    """True if ``encode_args`` would accept ``text`` as encoded (no NUL, escaped or raw; valid
    UTF-8; at most ``limit`` bytes). False means "ask encode_args", not "invalid"."""
    if type(text) is not str or "\x00" in text or "\\u0000" in text:
        return False
    if text.isascii():  # one byte per character: no encode needed for the size
        return len(text) <= limit
    try:
        return len(text.encode("utf-8")) <= limit
    except UnicodeEncodeError:  # a lone surrogate
        return False


def encode_fast(args: Mapping[str, Any], dumps: Dumps, limit: int) -> str:
    """``encode_args(dict(args), dumps, limit)``, faster when the text is plainly fine."""
    if type(args) is dict:
        # A loop, not all() over a generator: a single enqueue's keys are few, and the
        # generator's frame cost more than the checks.
        for key in args:
            if type(key) is not str:
                break
        else:
            try:
                # An encoder extending strict_dumps gives its text whenever it succeeds, so
                # strict_dumps is asked first, without the encoder's own wrapper around it
                # (the Celery facade's is a quarter of this call); what it cannot encode
                # goes to encode_args, which asks the encoder itself.
                text = strict_dumps(args) if is_strict(dumps) else dumps(args)
            except (TypeError, ValueError, RecursionError):
                pass  # encode_args raises the InvalidArgs with its message
            else:
                if storable(text, limit):
                    return text
    return encode_args(dict(args), dumps, limit)


def _str_keys(mappings: Iterable[dict[Any, Any]]) -> bool:
    """Whether every key of every mapping is a str (not a subclass): one C-level pass."""
    return set(map(type, chain.from_iterable(mappings))) <= {str}


def _encode_chunk(chunk: list[Mapping[str, Any]], dumps: Dumps, limit: int) -> str:
    """One JSON array holding the encoded args of every job of ``chunk``, each validated
    exactly as ``encode_args`` does: the first bad job raises its own InvalidArgs."""
    return encode_chunk_items(chunk, dumps, limit)[0]


def encode_chunk_items(chunk: list[Mapping[str, Any]], dumps: Dumps,
                        limit: int) -> tuple[str, list[str] | None]:
    """``_encode_chunk``, and the jobs' own texts when they were encoded one by one (None
    when one ``strict_dumps`` call made the array: ``strict_dumps`` of an item decoded
    from it gives that item's text)."""
    if is_strict(dumps):
        # One strict_dumps() for the whole chunk. With the json module's compact encoder an array is
        # "[" + the items' own encodings joined by "," + "]", so an array that is storable and
        # within the limit holds only storable items within the limit.
        try:
            jobs = [kwargs if type(kwargs) is dict else dict(kwargs) for kwargs in chunk]
            if _str_keys(jobs):
                text = strict_dumps(jobs)  # what dumps gives (is_strict)
                if storable(text, limit):
                    return text, None
        except (TypeError, ValueError, RecursionError):
            pass  # one by one below, where the first bad job raises its own error
    # Job by job (any other dumps may encode an item differently inside an array): encode_fast
    # returns what encode_args returns, or raises what it raises, in input order.
    items = [encode_fast(kwargs, dumps, limit) for kwargs in chunk]
    return "[" + ",".join(items) + "]", items


def encode_pairs(chunk: list[Mapping[str, Any]], metas: list[Mapping[str, Any]],
                  dumps: Dumps, limit: int) -> tuple[str, list[tuple[str, str]] | None]:
    """``encode_chunk_items`` of jobs that each have their own meta: one JSON array of
    ``[args, meta]`` per job (the form the workflow inserts take), each part validated as
    ``encode_args`` validates args; the first bad job raises its own InvalidArgs (its args
    checked before its meta)."""
    if is_strict(dumps):
        # As in encode_chunk_items: with the compact encoder an array within the limit and
        # storable proves each of its parts is.
        try:
            pairs = [[args if type(args) is dict else dict(args),
                      meta if type(meta) is dict else dict(meta)]
                     for args, meta in zip(chunk, metas, strict=True)]
            if _str_keys(chain.from_iterable(pairs)):
                text = strict_dumps(pairs)
                if storable(text, limit):
                    return text, None
        except (TypeError, ValueError, RecursionError):
            pass
    items = [(encode_fast(args, dumps, limit), encode_fast(meta, dumps, limit))
             for args, meta in zip(chunk, metas, strict=True)]
    return "[" + ",".join([f"[{args},{meta}]" for args, meta in items]) + "]", items


def encode_split(chunk: list[Mapping[str, Any]], meta_texts: list[str], dumps: Dumps,
                  limit: int) -> tuple[str, list[tuple[str, str]] | None]:
    """``encode_pairs`` of jobs whose metas are encoded already (``TaskCall.rows``'
    ``meta_texts``): one JSON object ``{"args": [...], "meta": [...]}``, the args encoded as
    ``encode_chunk_items`` encodes them (one ``strict_dumps`` call for the chunk) and the
    metas spliced in as they are. Encoding a meta dict per job was most of a big group's
    encoding time."""
    args_text, items = encode_chunk_items(chunk, dumps, limit)
    text = f'{{"args":{args_text},"meta":[{",".join(meta_texts)}]}}'
    return text, None if items is None else list(zip(items, meta_texts, strict=True))


def checked_meta_texts(texts: Iterable[str], count: int, limit: int) -> list[str]:
    """``meta_texts`` as ``TaskCall.rows`` takes them: one text per job, each the text of a
    JSON object within ``limit`` (its JSON itself is the integration's to get right: the
    insert refuses a bad one, with nothing inserted)."""
    own = texts if isinstance(texts, list) else list(texts)
    if len(own) != count:
        raise ValueError(f"{len(own)} meta texts for {count} jobs")
    for text in own:
        if type(text) is not str or text[:1] != "{" or text[-1:] != "}":
            raise TypeError(f"a meta text is the JSON text of an object, not {text!r:.80}")
        if len(text) * 4 > limit:  # UTF-8 takes at most 4 bytes a character
            size = len(text.encode())
            if size > limit:
                raise InvalidArgs(f"job meta is {size} bytes, over the limit of {limit} bytes")
    return own


#: The positions the ``position`` column holds (a Postgres integer).
POSITIONS = range(-2**31, 2**31)


def encode_many(kwargs_list: Iterable[Mapping[str, Any]], dumps: Dumps = strict_dumps,
                limit: int = DEFAULT_MAX_ARGS_BYTES) -> list[str]:
    """Validate and encode the args of many jobs (``InvalidArgs`` on the first bad one);
    returns them as JSON arrays of up to ``BULK_CHUNK`` jobs each, in input order, the form
    ``database.insert_jobs`` takes."""
    items = list(kwargs_list)
    return [_encode_chunk(items[start:start + BULK_CHUNK], dumps, limit)
            for start in range(0, len(items), BULK_CHUNK)]


#: One JSON array (or object) of up to ``BULK_CHUNK`` jobs, with its jobs' own texts when they
#: were encoded one by one (see ``encode_chunk_items``).
Chunk = tuple[str, list[Any] | None]


class Rows:
    """Many jobs of one call, encoded in bulk (``TaskCall.rows``): the row template, how many
    jobs, and per JSON array of up to ``BULK_CHUNK`` jobs its text with, when they were
    encoded one by one, its jobs' own texts. ``pairs``: each job has its own meta (the
    array's jobs are ``[args, meta]``, or the chunk is ``{"args": [...], "meta": [...]}``),
    else each job is its args. ``first_position``: the jobs' positions in their fan-out
    (the ``position`` column) are this and one more per job (the chunk is ``{"args": [...],
    "index": <its first job's position>}``).

    ``encode(k)`` makes array ``k``; all of them are made at once unless ``deferred``, when
    each is made when first asked for (``chunk``, ``encoded``): a big fan-out's arrays
    encoded while the database inserts the first ones (``Workflow.enqueue``), the error of
    a bad job raised then."""

    __slots__ = ("_chunks", "_encode", "count", "first_position", "pairs", "template")

    def __init__(self, template: JobRequest, count: int, pairs: bool,
                 encode: Callable[[int], Chunk], *, first_position: int | None = None,
                 deferred: bool = False) -> None:
        self.template, self.count, self.pairs = template, count, pairs
        self.first_position = first_position
        self._encode = encode
        self._chunks: list[Chunk] = []
        if not deferred:
            self.encoded()

    @property
    def chunk_count(self) -> int:
        """How many arrays these jobs are sent in."""
        return -(-self.count // BULK_CHUNK)

    @property
    def deferred(self) -> bool:
        """Whether some of the arrays are still to be encoded."""
        return len(self._chunks) < self.chunk_count

    def chunk(self, index: int) -> Chunk:
        """Array ``index`` (and the arrays before it, encoded in order: the first bad job's
        error is the one raised)."""
        chunks = self._chunks
        while len(chunks) <= index:
            chunks.append(self._encode(len(chunks)))
        return chunks[index]

    def encoded(self) -> list[Chunk]:
        """Every array, in order."""
        if self.deferred:
            self.chunk(self.chunk_count - 1)
        return self._chunks

    def job(self, position: int, decoded: dict[int, Any]) -> tuple[str, str]:
        """Job ``position``'s (args, meta) texts. An array made by one ``strict_dumps`` call
        is decoded once (into ``decoded``: chunk index -> its items): ``strict_dumps`` of an
        item decoded from it gives the same JSON value as the item's text inside it (the same
        text but for keys that collided in the array, of which jsonb keeps the last too)."""
        chunk, offset = divmod(position, BULK_CHUNK)
        text, items = self.chunk(chunk)
        if items is not None:
            item = items[offset]
            return item if self.pairs else (item, self.template.meta)
        values = decoded.get(chunk)
        if values is None:
            values = decoded[chunk] = json.loads(text)
        if type(values) is dict:  # {"args": [...], "meta": [...]}, or numbered
            args = strict_dumps(values["args"][offset])
            if self.first_position is not None:
                return args, self.template.meta
            return args, strict_dumps(values["meta"][offset])
        value = values[offset]
        if not self.pairs:
            return strict_dumps(value), self.template.meta
        return strict_dumps(value[0]), strict_dumps(value[1])

    def position(self, index: int) -> int | None:
        """The position of job ``index`` (of these rows) in its fan-out, if numbered."""
        first = self.first_position
        return None if first is None else first + index
