"""The SQL text the client sends: the .sql files' comments stay there, for the reader."""

from __future__ import annotations

from psycopg import _queries

from akadze_core.store.queries import all_queries, load_queries, query


def test_no_query_carries_its_comment_lines() -> None:
    for name, text in all_queries().items():
        assert not any(line.lstrip().startswith("--") for line in text.splitlines()), name


def test_the_hot_statements_fit_psycopgs_conversion_cache() -> None:
    # Longer than this, psycopg re-parses the text on every execution (no lru_cache).
    for name in ("job_claim", "job_complete_many", "statement_lock_timeout"):
        assert len(query(name)) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name


def test_a_comment_inside_a_line_and_a_string_stay() -> None:
    groups = load_queries("akadze_compat", "sql/groups.sql")
    assert groups  # integrations' files load through the same parser
    rows = query("job_insert_rows")
    # Only whole comment lines go: a comment after code stays with it.
    assert "OFFSET 0) AS p  -- parsed once" in rows
    rescue = query("job_rescue")
    assert "'queued'" in rescue
