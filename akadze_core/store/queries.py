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


#: The statements of sql/queries.sql that Citus runs as written (router queries, reads that
#: any shard may answer, the reference tables'). Every other one not rewritten in
#: sql/citus/queries.sql is refused in Citus mode.
CITUS_AS_IS = frozenset({
    "job_get_many", "job_list", "job_stats", "job_list_scheduled", "job_find_by_task_id",
    "job_purge", "job_list_revoked", "job_list_terminating", "task_id_key",
    "worker_register", "worker_heartbeat", "worker_set_queues", "worker_unregister",
    "worker_list", "statement_lock_timeout", "autovacuum_runs", "schedule_clock",
    "schedule_list", "schedule_code_list", "schedule_start", "schedule_reset",
    "schedule_runtime_timing", "schedule_runtime_versions", "schedule_runtime_fingerprint",
    "control_pending", "control_replies", "control_prune", "control_revoked",
    "control_scheduled", "schedule_owner", "schedule_runtime_list", "fair_index_drop",
    "fair_index_state",
    "fair_index_try_lock", "fair_index_unlock", "fair_index_untimed", "metrics_job_counts",
    "metrics_state_estimates",
    "metrics_queues", "metrics_workers", "metrics_recent",
    # Pauses: a reference table, and functions that run on the coordinator (their advisory
    # lock too, which every Citus claim takes there before reading the table).
    "queue_pause", "queue_resume", "queue_paused",
})

#: The dialect in use: "postgres", or "citus" once :func:`use_dialect` chose it.
_dialect = ["postgres"]
#: The statements of the dialect in use, by name; filled at the first query.
_active: dict[str, str] = {}


def citus_queries() -> dict[str, str]:
    """Every statement name, as the Citus dialect runs it: rewritten, as written, or a
    statement that raises (fail closed) for what Citus mode does not do yet."""
    base = all_queries()
    rewritten = load_queries("akadze_core", "sql/citus/queries.sql")
    # FeatureNotSupported naming the statement; the name, ours, is a literal of the text.
    refused = {name: f"SELECT akadze.citus_refuse('{name}')" for name in base}
    return {**refused, **{name: base[name] for name in CITUS_AS_IS}, **rewritten}


def use_dialect(dialect: str) -> None:
    """Choose the SQL dialect of this process: "postgres" (one server) or "citus". Chosen at
    connect and migrate time, not per statement: every App of a process shares it."""
    if dialect not in ("postgres", "citus"):
        raise ValueError(f"unknown SQL dialect {dialect!r}: 'postgres' or 'citus'")
    _dialect[0] = dialect
    _active.clear()
    _active.update(citus_queries() if dialect == "citus" else all_queries())


def dialect() -> str:
    """The SQL dialect of this process (:func:`use_dialect`)."""
    return _dialect[0]


def query(name: str) -> str:
    """The SQL text of one named block, in the dialect of this process."""
    try:
        return _active[name]
    except KeyError:
        if not _active:
            _active.update(all_queries())
        return _active[name]


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration file, in order."""
    folder = resources.files("akadze_core").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d+)_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text("utf-8")))
    return sorted(found)
