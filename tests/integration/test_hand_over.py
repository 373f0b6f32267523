"""``current().hand_over(...)`` (what Celery's ``Task.replace`` is built on), on a real
Postgres and worker: inside ``complete_tx`` a running job inserts its replacement and passes
what waits on it to the replacement, all committed with its success or not at all.
"""

from __future__ import annotations

from typing import Any

import psycopg

from akadze_core import App, NotOwner, current
from tests.helpers import job
from tests.integration.outcome_helpers import run_until


def register(app: App, *, takeover: bool = False) -> dict[str, Any]:
    seen: dict[str, Any] = {"errors": []}

    @app.task("ho.double")
    async def double(x: int) -> int:
        return x * 2

    @app.task("ho.add")
    async def add(x: int, y: int) -> int:
        return x + y

    @app.task("ho.replaced")
    async def replaced(x: int) -> None:
        context = current()
        try:
            async with context.complete_tx() as connection:
                replacement = await add.using(session=connection).enqueue(x=x, y=100)
                seen["replacement"] = replacement
                if takeover:  # rescued and claimed again meanwhile
                    with psycopg.connect(app.database_url, autocommit=True) as other:
                        other.execute("UPDATE akadze.jobs SET run_count = run_count + 1 "
                                      "WHERE id = %s", (context.id,))
                await context.hand_over_async(connection, replacement)
        except NotOwner as exc:
            seen["errors"].append(exc)
            raise

    seen.update(double=double, add=add, replaced=replaced)
    return seen


def ended(db: psycopg.Connection, job_id: int) -> bool:
    return job(db, job_id)["state"] in ("succeeded", "failed", "cancelled")


async def test_what_waits_on_the_job_runs_after_its_replacement(
        app: App, db: psycopg.Connection) -> None:
    t = register(app)
    flow = app.workflow()
    first = flow.add(t["replaced"], x=1)
    flow.add(t["double"], after=first, result_arg="x")
    first_id, last_id = flow.enqueue()
    await run_until(app, lambda: ended(db, last_id))
    assert job(db, last_id)["state"] == "succeeded"
    assert job(db, last_id)["result"] == 202  # double(add(1, 100))
    original = job(db, first_id)
    assert original["state"] == "succeeded" and original["dependents"] is None
    assert original["meta"]["replaced_by"] == t["replacement"]
    assert job(db, last_id)["upstreams"] == [t["replacement"]]


async def test_a_run_that_lost_the_job_hands_nothing_over(
        app: App, db: psycopg.Connection) -> None:
    t = register(app, takeover=True)
    flow = app.workflow()
    first = flow.add(t["replaced"], x=1)
    flow.add(t["double"], after=first, result_arg="x")
    first_id, last_id = flow.enqueue()
    await run_until(app, lambda: bool(t["errors"]))
    assert isinstance(t["errors"][0], NotOwner)
    # Rolled back: no replacement row, the waiting job still waits on the original.
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE task = 'ho.add'"
                      ).fetchone() == (0,)
    assert job(db, last_id)["state"] == "waiting"
    assert job(db, last_id)["upstreams"] == [first_id]
    assert "replaced_by" not in job(db, first_id)["meta"]
