"""Helpers of the fault suite: a supervised fleet of worker processes, and database probes.

Everything is asserted from the database; tests poll it (``wait_until``) instead of sleeping.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg

from tests.helpers import job
from tests.workers.support import WorkerProcess, wait_until

__all__ = ["Fleet", "all_runs", "error_types", "job", "rows_by_id", "wait_until"]

Spawn = Callable[..., WorkerProcess]


def error_types(row: dict[str, Any]) -> list[str]:
    """The ``type`` of each entry of a job's ``errors``."""
    return [entry["type"] for entry in row["errors"]]


def all_runs(db: psycopg.Connection) -> list[tuple[int, int, int]]:
    """Every recorded run start: (job_id, run_count, pid)."""
    return db.execute("SELECT job_id, run_count, pid FROM runs ORDER BY started").fetchall()


def rows_by_id(db: psycopg.Connection, ids: list[int] | None = None) -> dict[int, dict[str, Any]]:
    """The job rows (all, or those of ``ids``) by id."""
    from psycopg.rows import dict_row

    with db.cursor(row_factory=dict_row) as cursor:
        if ids is None:
            cursor.execute("SELECT * FROM akadze.jobs")
        else:
            cursor.execute("SELECT * FROM akadze.jobs WHERE id = ANY(%s)", (ids,))
        return {row["id"]: row for row in cursor.fetchall()}


def count(db: psycopg.Connection, sql: str, params: Any = None) -> int:
    """The integer the query returns."""
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def one_line(output: str, prefix: str = "akadze: error: ") -> str:
    """The single line of ``output`` starting with ``prefix`` (asserts there is exactly one)."""
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, output
    assert "Traceback" not in output, output
    return lines[0]


class Fleet:
    """Worker processes under a supervisor: ``supervise()`` replaces every dead member.

    Mirrors what systemd or Kubernetes does for a real deployment: a worker that died (a
    poison pill, the chaos monkey) is started again with the same options.
    """

    def __init__(self, spawn: Spawn, url: str, size: int, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self._spawn = spawn
        self._url = url
        self._args = args
        self._env = env
        self.members = [self._start(index) for index in range(size)]
        #: Every member that ended, in the order the supervisor noticed.
        self.ended: list[WorkerProcess] = []
        #: The pids this test SIGKILLed itself (``kill``).
        self.killed: set[int] = set()

    def _start(self, index: int) -> WorkerProcess:
        return self._spawn(self._url, *self.args_for(index), env=self._env)

    def args_for(self, index: int) -> tuple[str, ...]:
        """The options member ``index`` is started with (the same for all here)."""
        return self._args

    def supervise(self) -> int:
        """Restart the members that exited; returns how many were restarted."""
        restarted = 0
        for index, member in enumerate(self.members):
            if member.proc.poll() is not None:
                self.ended.append(member)
                self.members[index] = self._start(index)
                restarted += 1
        return restarted

    def kill(self, index: int) -> int:
        """SIGKILL member ``index`` (the supervisor restarts it); returns its pid."""
        member = self.members[index]
        member.signal(signal.SIGKILL)
        member.proc.wait(10)
        self.killed.add(member.pid)
        return member.pid

    def deaths_by_signal(self) -> Counter[int]:
        """How the ended members ended: exit code (negative: the signal) -> count."""
        return Counter(member.proc.returncode for member in self.ended)

    def alive(self) -> list[WorkerProcess]:
        """The members still running."""
        return [member for member in self.members if member.proc.poll() is None]

    def logs(self) -> str:
        """Every member's log, ended ones included."""
        return "\n".join(member.log() for member in [*self.ended, *self.members])

    def stop(self, timeout: float = 20.0) -> list[int]:
        """SIGTERM every live member and wait; returns their exit codes. Members already
        dead (ended since the last ``supervise``) join ``ended``."""
        live = []
        for member in self.members:
            (live if member.proc.poll() is None else self.ended).append(member)
        for member in live:
            # A member restarted a moment ago may still be importing (seconds, under load),
            # before it installs its SIGTERM handler: the default action would kill it (-15)
            # instead of stopping it. Its start line comes after the handler.
            deadline = time.monotonic() + timeout
            while ") started: queues" not in member.log() and member.proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
        for member in live:
            member.signal(signal.SIGTERM)
        return [member.wait_exit(timeout)[0] for member in live]
