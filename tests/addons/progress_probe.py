"""celery-progress as its docs show it: a bound task reports with ``ProgressRecorder``, the
page polls ``Progress(AsyncResult(task_id)).get_info()`` (what its ``get_progress`` view
returns). ``python progress_probe.py BROKER BACKEND``; prints the distinct answers seen, in
order. The task waits for the poller to see each step, so both sides see the same steps.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery_progress.backend import Progress, ProgressRecorder

BROKER, BACKEND = sys.argv[1], sys.argv[2]
app = Celery("progress", broker=BROKER, backend=BACKEND, set_as_current=True)
app.conf.task_default_queue = f"progress-{uuid.uuid4().hex[:8]}"
#: The last PROGRESS step the poller saw: the task goes on once its step was seen.
seen = {"current": 0}
seen_changed = threading.Condition()


def wait_seen(current):
    with seen_changed:
        seen_changed.wait_for(lambda: seen["current"] >= current, timeout=20)


@app.task(bind=True, name="progress.count")
def count(self, total):
    recorder = ProgressRecorder(self)
    for step in range(total):
        recorder.set_progress(step + 1, total, description=f"step {step + 1}")
        wait_seen(step + 1)
    return f"counted {total}"


@app.task(bind=True, name="progress.broken")
def broken(self):
    ProgressRecorder(self).set_progress(1, 2)
    wait_seen(1)
    raise KeyError("lost")


def poll(task_id):
    answers = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = Progress(AsyncResult(task_id)).get_info()
        if not answers or answers[-1] != info:
            answers.append(info)
        if info.get("state") == "PROGRESS":
            with seen_changed:
                seen["current"] = info["progress"]["current"]
                seen_changed.notify_all()
        if info.get("complete"):
            return answers
        time.sleep(0.05)
    raise SystemExit(f"no end: {answers}")


with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
    first = poll(count.delay(3).id)
    seen["current"] = 0
    second = poll(broken.delay().id)
# PENDING before the worker claims it is a race: keep the steps from PROGRESS on.
print(json.dumps({"count": [a for a in first if a["state"] != "PENDING"],
                  "broken": [a for a in second if a["state"] != "PENDING"]}, sort_keys=True))
