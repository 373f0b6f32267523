"""The real-Celery twin of ``bench.apps.celery_app``: the same sync no-op, results ignored.

Runs only in the Celery virtualenv. Configured by the environment: ``BENCH_BROKER_URL``,
``BENCH_QUEUE``, ``BENCH_STATS_DIR``.

How the drain is timed, at almost no cost per task: each worker process counts the tasks it
finished and remembers when its first one started and its last one ended (``task_prerun`` /
``task_postrun`` signals, in memory); a daemon thread writes these three numbers to
``$BENCH_STATS_DIR/<pid>.json`` every 100 ms when they changed. The benchmark sums the files
and, once the count reaches the number published, takes the window from the earliest first
start to the latest last end.
"""

from __future__ import annotations

import json
import os
import threading
import time

from celery import Celery
from celery.signals import task_postrun, task_prerun

app = Celery("celery_bench_app", broker=os.environ["BENCH_BROKER_URL"])
app.conf.update(
    task_ignore_result=True,
    task_default_queue=os.environ.get("BENCH_QUEUE", "akadze_bench"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
)
if os.environ.get("BENCH_RESULT_BACKEND"):  # the chord program (celery_bench_canvas)
    app.conf.update(result_backend=os.environ["BENCH_RESULT_BACKEND"], result_expires=3600)


@app.task(name="bench.noop", ignore_result=True)
def noop(n: int = 0) -> None:
    """Does nothing."""


@app.task(name="bench.chord_member", ignore_result=False)
def chord_member(n: int = 0) -> None:
    """A chord's no-op member (its result is stored: the chord counts them)."""


@app.task(name="bench.chord_body", ignore_result=False)
def chord_body(results: object = None) -> float:
    """A chord's body: returns the wall-clock time at which it started."""
    return time.time()


class _Stats:
    """This process's count and first/last times, flushed to a file by a daemon thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None

    def started(self) -> None:
        if self.pid != os.getpid():  # first task in this (possibly forked) process
            self.pid = os.getpid()
            self.count, self.first, self.last = 0, time.time(), None
            threading.Thread(target=self._flush_forever, daemon=True).start()

    def finished(self) -> None:
        now = time.time()
        with self.lock:
            self.count += 1
            self.last = now

    def _flush_forever(self) -> None:
        directory = os.environ["BENCH_STATS_DIR"]
        path = os.path.join(directory, f"{os.getpid()}.json")
        written = None
        while True:
            with self.lock:
                state = (self.count, self.first, self.last)
            if state != written:
                temporary = f"{path}.tmp"
                with open(temporary, "w") as output:
                    json.dump({"count": state[0], "first": state[1], "last": state[2]}, output)
                os.replace(temporary, path)
                written = state
            time.sleep(0.1)


_stats = _Stats()


@task_prerun.connect
def _on_prerun(**kwargs: object) -> None:
    _stats.started()


@task_postrun.connect
def _on_postrun(**kwargs: object) -> None:
    _stats.finished()
