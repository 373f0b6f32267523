"""docs/how-to/citus.md's Python block runs as written, on the cluster."""

from __future__ import annotations

import psycopg

from akadze_core.store.queries import use_dialect
from tests.examples.test_docs import DOCS, page_section
from tests.examples.test_readme import blocks

CITUS = DOCS / "how-to" / "citus.md"


def test_the_citus_example_runs_as_written(citus_url: str, citus_db: psycopg.Connection) -> None:
    code = blocks(page_section(CITUS, "Turn it on"), "python")[0]
    namespace = {"DATABASE_URL": citus_url}
    try:
        exec(compile(code, str(CITUS), "exec"), namespace)
        job_id = namespace["job_id"]
        row = citus_db.execute("SELECT shard, meta->>'tenant' FROM akadze.jobs WHERE id = %s",
                               (job_id,)).fetchone()
        expected = citus_db.execute(
            "SELECT akadze.citus_shard_for('{\"tenant\": \"acme\"}', NULL, 'default', '{}', 1)"
        ).fetchone()
        assert expected is not None
        assert row == (expected[0], "acme")
        assert job_id % 1024 == expected[0]
        namespace["app"].close()
    finally:
        use_dialect("postgres")
