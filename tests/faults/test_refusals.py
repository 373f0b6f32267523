"""Errors no retry can fix: wrong password, permission denied.

Seed 000, "Ошибки базы": other database errors (schema not applied) stop the worker. The real
``akadze`` command runs against a private cluster that checks passwords (scram-sha-256), as
roles that lack privileges. Each case ends with exactly one ``akadze: error:`` line, a
non-zero exit within seconds, no "retrying" loop, and no password anywhere in the output.
The missing schema is covered by tests/workers/test_database_errors.py::
test_missing_schema_exits_at_once_saying_to_migrate and tests/integration/test_cli.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.faults.support import one_line
from tests.workers.support import PROJECT_ROOT, PrivateCluster

pytestmark = pytest.mark.slow

CLI_APP = "tests.integration.cli_app:app"
ROLE_PASSWORD = "R0lePW-7f3a"
WORKER_OPTIONS = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", "1", "--poll-interval", "0.1")


def akadze(url: str, *args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess[str],
                                                               float]:
    """Run ``akadze --database-url URL ARGS``; returns the result and how long it took."""
    env = {key: value for key, value in os.environ.items() if key != "AKADZE_DATABASE_URL"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "akadze_core.cli", "--database-url", url,
                             *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return result, time.monotonic() - started


def assert_refused(result: subprocess.CompletedProcess[str], took: float, *secrets: str) -> str:
    """One error line, exit 1, quickly, no retry loop, no secret; returns the line."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    line = one_line(output)
    assert took < 10, (took, output)
    assert "retrying" not in output and "cannot reach the database" not in output, output
    for secret in secrets:
        assert secret not in output, output
    return line


@pytest.fixture
def roles(password_cluster: PrivateCluster) -> Iterator[psycopg.Connection]:
    """A superuser connection to the password-checking cluster (local socket, trusted)."""
    with psycopg.connect(password_cluster.url(), autocommit=True) as admin:
        yield admin


def create_role(admin: psycopg.Connection, name: str, *grants: str) -> None:
    """A login role with ``ROLE_PASSWORD`` and the given GRANT statements (``{role}``)."""
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
        sql.Identifier(name), sql.Literal(ROLE_PASSWORD)))
    for grant in grants:
        admin.execute(grant.format(role=name))


@pytest.mark.parametrize("command", [("worker", CLI_APP, *WORKER_OPTIONS), ("migrate",),
                                     ("stats",), ("jobs", "list")], ids=lambda c: c[0])
def test_wrong_password_is_one_line_and_no_retry_loop(
    password_cluster: PrivateCluster, command: tuple[str, ...]
) -> None:
    wrong = "Wr0ngPW-c41d"
    url = password_cluster.url_for("postgres", wrong)
    result, took = akadze(url, *command)
    line = assert_refused(result, took, wrong, PrivateCluster.PASSWORD)
    assert "password authentication failed" in line, line


PERMISSIONS = {
    # Not even USAGE on the schema: the schema check at start is refused.
    "nothing": ((), "permission denied for schema akadze"),
    # Can read the schema version but not register: the worker row insert is refused.
    "read-only": (("GRANT USAGE ON SCHEMA akadze TO {role}",
                   "GRANT SELECT ON ALL TABLES IN SCHEMA akadze TO {role}"),
                  "permission denied for table workers"),
    # Starts and heartbeats, but cannot delete dead workers' rows: the first rescue is refused
    # mid-run and the worker stops instead of retrying.
    "no delete": (("GRANT USAGE ON SCHEMA akadze TO {role}",
                   "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA akadze TO {role}"),
                  "permission denied for table workers"),
}


@pytest.mark.parametrize("case", PERMISSIONS, ids=list(PERMISSIONS))
def test_permission_denied_stops_the_worker_with_one_line(
    password_cluster: PrivateCluster, roles: psycopg.Connection, case: str
) -> None:
    grants, message = PERMISSIONS[case]
    role = f"akadze_{case.replace(' ', '_').replace('-', '_')}"
    create_role(roles, role, *grants)
    url = password_cluster.url_for(role, ROLE_PASSWORD)
    result, took = akadze(url, "worker", CLI_APP, *WORKER_OPTIONS)
    line = assert_refused(result, took, ROLE_PASSWORD, PrivateCluster.PASSWORD)
    assert "permission denied" in line and message in line, line
    if case == "no delete":
        # It had started: it said so, then stopped on the refusal, once.
        assert ") started: queues" in result.stderr, result.stderr
        assert result.stderr.count("rescue failed") == 1, result.stderr
