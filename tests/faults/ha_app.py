"""The app of the Patroni failover test's ``akadze worker`` processes
(``akadze worker tests.faults.ha_app:app``), on the DSN in ``AKADZE_DATABASE_URL``.

``ha_record`` writes one row per run of its body into ``ha_runs`` (job id, run_count, claim
token, pid) and returns the claim token: the test then sees every run, and which run's
outcome the job kept. The row is written on a connection of its own, retried through a
failover (a body in flight while no server takes writes); a retry of the same run changes
nothing (ON CONFLICT).
"""

from __future__ import annotations

import os
import time

import psycopg

from akadze_core import App, current

HA_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS ha_runs (
    job_id      bigint  NOT NULL,
    run_count   integer NOT NULL,
    claim_token bigint  NOT NULL,
    pid         integer NOT NULL,
    PRIMARY KEY (job_id, run_count, claim_token)
)
"""

_RECORD = ("INSERT INTO ha_runs (job_id, run_count, claim_token, pid) VALUES (%s, %s, %s, %s)"
           " ON CONFLICT DO NOTHING")

URL = os.environ.get("AKADZE_DATABASE_URL", "")
app = App(URL)


@app.task("ha_record")
def ha_record() -> int | None:
    """Record this run (retrying for up to a minute), return its claim token."""
    context = current()
    token = context.job.claim_token
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(URL, autocommit=True, connect_timeout=2,
                                 application_name="akadze-ha-task") as connection:
                connection.execute(_RECORD, (context.id, context.run_count, token,
                                             os.getpid()))
            return token
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
