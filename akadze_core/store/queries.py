"""Load the named SQL blocks of ``sql/queries.sql`` (one source for sync and async code)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# A line that is only a comment. The comments stay in the .sql file for the reader; sent
# with every execution they made the claim and the outcome write longer than the 4096
# characters psycopg caches the conversion of, so each call re-parsed ~5 KB of text.
_COMMENT_LINE = re.compile(r"^[ \t]*--.*\n?", re.MULTILINE)


@cache
def load_queries(package: str, path: str) -> dict[str, str]:
    """The named blocks (``-- name: x``) of the SQL file ``path`` in ``package``, parsed once:
    akadze_core's own, or an integration's (run with ``database.run_statement``)."""
    text = resources.files(package).joinpath(path).read_text("utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: _COMMENT_LINE.sub("", body).strip()
            for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def all_queries() -> dict[str, str]:
    """Every query of akadze_core by name, parsed once."""
    return load_queries("akadze_core", "sql/queries.sql")


def query(name: str) -> str:
    """The SQL text of one named block."""
    return all_queries()[name]


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration file, in order."""
    folder = resources.files("akadze_core").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d+)_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text("utf-8")))
    return sorted(found)
