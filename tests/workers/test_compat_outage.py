"""``akadze-compat worker`` after a Postgres outage longer than its heartbeat TTL: like the
core worker it exits 1, and its last akadze line tells the operator that a supervisor must
start it again (migration_guide/deployment.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.compat.cli_harness import PROJECTS, CompatWorker
from tests.workers.support import PrivateCluster

pytestmark = pytest.mark.slow


def test_compat_worker_exits_1_with_the_supervisor_line_after_a_long_outage(
        cluster: PrivateCluster, tmp_path: Path) -> None:
    ttl = 1.5
    worker = CompatWorker(
        tmp_path / "compat.log",
        ["-b", cluster.url(), "-A", "plainproj", "worker", "-P", "threads", "-c", "2",
         "-l", "INFO"],
        cwd=PROJECTS,
        env={"AKADZE_HEARTBEAT_INTERVAL": "0.2", "AKADZE_HEARTBEAT_TTL": str(ttl)})
    try:
        worker.wait_ready()
        cluster.stop()
        stopped = time.monotonic()
        code = worker.wait_exit(timeout=30)
        took = time.monotonic() - stopped
        assert code == 1, worker.log()
        assert ttl <= took < ttl + 6, (took, worker.log())
        lines = [line for line in worker.log().splitlines() if "exiting with status 1" in line]
        assert len(lines) == 1, worker.log()
        assert f"unreachable for longer than heartbeat_ttl ({ttl:g}s)" in lines[0]
        assert "run it under a supervisor that restarts it" in lines[0]
    finally:
        worker.stop()
