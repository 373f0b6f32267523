"""Run the Celery-style example end to end: ``python -m examples.celery_project``.

It starts ``akadze-compat -A examples.celery_project worker`` as a subprocess (its log goes
to stderr), sends tasks the Celery way, prints what happens to them on stdout, then stops
the worker with SIGTERM and exits. Without ``AKADZE_DATABASE_URL`` (or a ``broker_url``)
everything runs on the embedded Postgres of the project (``.akadze/`` of the repository
root, or ``$AKADZE_HOME``; see ``akadze_core.store.embedded``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

import akadze_compat
from akadze_compat.result import AsyncResult

from .celery import app
from .tasks import VendorDown, add, always_down, fetch_rate, sync_crm

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the examples package
WORKER = ["-A", "examples.celery_project", "worker", "-P", "threads", "-c", "4", "-l", "INFO"]


def say(text: str) -> None:
    print(text, flush=True)


def start_worker(database_url: str) -> subprocess.Popen[bytes]:
    say(f"$ akadze-compat {' '.join(WORKER)}")
    env = {**os.environ, "AKADZE_DATABASE_URL": database_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    # stdout too goes to our stderr: this script's own story is alone on stdout.
    return subprocess.Popen([sys.executable, "-m", "akadze_compat", *WORKER], env=env,
                            stdout=sys.stderr, stderr=sys.stderr)


def stop_worker(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)  # warm shutdown: running tasks may finish
    try:
        return worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


def wait_for_beat(timeout: float) -> str | None:
    """The result of the first periodic ``heartbeat`` run (read through the core app)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = app.core.list_jobs(task="examples.celery_project.tasks.heartbeat",
                                  state="succeeded", limit=1)
        if jobs:
            return f"{jobs[0].result!r} (tick {jobs[0].meta.get('tick')})"
        time.sleep(0.2)
    return None


def main() -> int:
    core = app.core          # the akadze_core App behind the Celery app
    core.migrate()           # create the schema if this database has none (idempotent)
    worker = start_worker(core.database_url)
    try:
        say("\n1. delay() and get(): the result comes back through Postgres")
        result = add.delay(2, 3)
        say(f"   add.delay(2, 3) -> task id {result.id}, state {result.state}")
        say(f"   result.get(timeout=30) -> {result.get(timeout=30)}")

        say("\n2. sending everything else at once")
        started = time.monotonic()
        later = add.apply_async((10, 20), countdown=2)
        say(f"   add.apply_async((10, 20), countdown=2) -> {later.id}")
        rate = fetch_rate.delay("EUR")
        say(f"   fetch_rate.delay('EUR') -> {rate.id}  (bind=True, self.retry twice)")
        crm = sync_crm.delay(42)
        say(f"   sync_crm.delay(42) -> {crm.id}  (autoretry_for, retry_backoff)")
        doomed = always_down.delay()
        say(f"   always_down.delay() -> {doomed.id}  (autoretry_for, max_retries=1)")

        say("\n3. transactional enqueue: a rolled-back transaction sends nothing")
        with psycopg.connect(core.database_url) as connection:
            with akadze_compat.transaction(connection):
                kept = add.delay(1, 1)
            try:
                with akadze_compat.transaction(connection):
                    dropped = add.delay(100, 100)
                    raise RuntimeError("the order insert failed")
            except RuntimeError:
                pass
        say(f"   committed task {kept.id}: exists={AsyncResult(kept.id).exists()}")
        say(f"   rolled-back task {dropped.id}: exists={AsyncResult(dropped.id).exists()}")

        say("\n4. results")
        say(f"   countdown: {later.get(timeout=30)} after {time.monotonic() - started:.1f}s")
        value = rate.get(timeout=30)
        say(f"   fetch_rate: {value} (state {rate.state}, retries {rate.retries})")
        say(f"   sync_crm: {crm.get(timeout=30)!r}")
        try:
            doomed.get(timeout=30)
        except VendorDown as exc:
            say(f"   always_down: get() raised {type(exc).__name__}: {exc} "
                f"(state {doomed.state})")

        say("\n5. AsyncResult(id) from anywhere, e.g. another process")
        again = AsyncResult(result.id)
        say(f"   AsyncResult({result.id!r}): state={again.state} result={again.result} "
            f"name={again.name} args={again.args}")
        say(f"   unknown id: AsyncResult('no-such-task').state = "
            f"{AsyncResult('no-such-task').state}")

        say("\n6. beat_schedule: the worker enqueues each tick itself (no beat process)")
        say(f"   first heartbeat: {wait_for_beat(timeout=20)}")
    finally:
        code = stop_worker(worker)
        say(f"\nworker stopped with SIGTERM, exit code {code}")
        app.close()
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
