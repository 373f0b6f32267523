"""Hostile queue, task and schedule names are data.

Enqueue, claim and run with such names is tests/integration/test_enqueue.py::
test_hostile_task_and_queue_names_are_stored_literally; schedules named like an injection are
tests/integration/test_schedules.py::test_hostile_names_are_stored_literally. Added here: the
CLI filters by such names and prints them literally.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from akadze_core import App
from akadze_core.cli.main import cli
from tests.helpers import job
from tests.integration.lease_support import scalar

NAMES = [
    "x'); DROP TABLE akadze.jobs;--",
    'q" OR 1=1; DELETE FROM akadze.workers --',
    "%(id)s %s {0} $1 $$ :name",
    "ünï😀 \\ back\\slash\ttab",
]


def tables(db: psycopg.Connection) -> list[str]:
    """The akadze tables, by name."""
    return [row[0] for row in db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'akadze' ORDER BY 1").fetchall()]


@pytest.mark.parametrize("name", NAMES)
def test_the_cli_filters_and_prints_hostile_names_literally(
    database_url: str, db: psycopg.Connection, name: str
) -> None:
    before = tables(db)
    app = App(database_url)
    try:
        task = app.task(name, queue=name)(lambda **kwargs: None)
        job_id = task.enqueue(value=name)
        decoy = app.task("plain")(lambda: None).enqueue()
    finally:
        app.close()

    def invoke(*args: str) -> Any:
        result = CliRunner().invoke(cli, list(args), env={"AKADZE_DATABASE_URL": database_url})
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    listed = invoke("jobs", "list", "--queue", name, "--task", name, "--json")
    assert [(row["id"], row["task"], row["queue"]) for row in listed] == [(job_id, name, name)]
    shown = invoke("jobs", "show", str(job_id), "--json")
    assert (shown["task"], shown["queue"], shown["args"]) == (name, name, {"value": name})
    assert set(invoke("stats", "--json")) == {name, "default"}
    assert tables(db) == before
    assert scalar(db, "SELECT count(*) FROM akadze.jobs") == 2
    assert job(db, decoy)["state"] == "queued"
