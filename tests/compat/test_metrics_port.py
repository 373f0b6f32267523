"""``akadze-compat worker --metrics-port``: the Celery-style worker serves the core worker's
/metrics, counting the tasks it ran (parsed with prometheus_client's parser)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.compat.cli_harness import run, wait_until
from tests.compat.conftest import SpawnCompat
from tests.workers.support import free_port

pytestmark = pytest.mark.slow


def runs_of(port: int, task: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "akadze_job_runs_total" and sample.labels == {
                    "queue": "metricsq", "task": task, "outcome": "succeeded"}:
                return sample.value
    return None


def test_the_compat_worker_serves_metrics_of_the_tasks_it_ran(
        database_url: str, spawn_compat: SpawnCompat) -> None:
    port = free_port()
    worker = spawn_compat("-b", database_url, "-A", "plainproj", "worker", "-P", "threads",
                          "-c", "2", "-Q", "metricsq", "-l", "INFO", "--metrics-port",
                          str(port))
    worker.wait_ready()
    task = "plainproj.billing.tasks.add"
    for numbers in ("[1, 2]", "[3, 4]"):
        done = run("-b", database_url, "-A", "plainproj", "call", task, "-a", numbers,
                   "--queue", "metricsq")
        assert done.returncode == 0, done.stderr
    wait_until(lambda: runs_of(port, task) == 2)
