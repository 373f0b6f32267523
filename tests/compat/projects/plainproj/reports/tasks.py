"""Report tasks: written with @app.task on the project's app."""

import os
import signal
import time
from datetime import datetime, timezone

from akadze_compat import current_task
from plainproj.celery import app


@app.task(bind=True)
def build_report(self, report_id, release_path):
    """Reports progress, then waits until the test releases it (or 30 s pass)."""
    self.update_state(state="PROGRESS", meta={"report": report_id, "step": 1, "of": 2})
    deadline = time.monotonic() + 30
    while not os.path.exists(release_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"report": report_id, "pages": 2}


@app.task
def remind(message):
    """Returns when it ran, to check countdown and eta."""
    return {"message": message, "ran_at": datetime.now(timezone.utc).isoformat()}


@app.task
def whoami(seconds=0.0):
    """CPU-bound work stands here: which process ran it?"""
    time.sleep(seconds)
    request = current_task.request
    return {"pid": os.getpid(), "hostname": request.hostname, "id": request.id,
            "group_index": request.group_index}


@app.task
def nap(seconds):
    time.sleep(seconds)
    return f"slept {seconds}"


@app.task(time_limit=1, max_retries=0)
def flaky(mode="fast"):
    """Returns at once ("fast"), kills its own process a moment after it started ("die") or
    outlives its time limit ("hang"): a short task, until it is not."""
    if mode == "die":
        time.sleep(0.3)  # while the worker sends the next jobs behind this one
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(3600)
    return os.getpid()


@app.task
def mark(path):
    """Creates the file ``path``: the mark that the task ran."""
    with open(path, "a", encoding="utf-8"):
        pass
    return path
