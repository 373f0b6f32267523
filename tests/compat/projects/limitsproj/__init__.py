"""limitsproj: tasks that block (sleep, a socket read) for the time limit and terminate tests.

Its signal receivers print one line each (``limitsproj-signal ...``) with the process id,
so a test can tell the worker process from its pool children.
"""

import asyncio
import os
import socket
import time

from akadze_compat import Celery
from akadze_compat.exceptions import SoftTimeLimitExceeded
from akadze_compat.signals import task_failure, task_revoked

app = Celery("limitsproj")
app.conf.task_acks_late = False
app.conf.worker_prefetch_multiplier = 1
if os.environ.get("LIMITSPROJ_SOFT"):
    app.conf.task_soft_time_limit = float(os.environ["LIMITSPROJ_SOFT"])
if os.environ.get("LIMITSPROJ_HARD"):
    app.conf.task_time_limit = float(os.environ["LIMITSPROJ_HARD"])


def _mark(path):
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(os.getpid()))


@app.task
def sleeper(path, seconds=30):
    """Writes its pid to ``path``, then sleeps; the soft limit ends the sleep early."""
    _mark(path)
    started = time.monotonic()
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return {"soft": True, "after": time.monotonic() - started, "pid": os.getpid()}
    return {"soft": False, "after": time.monotonic() - started, "pid": os.getpid()}


@app.task(soft_time_limit=1)
def soft_sleeper(path):
    """``sleeper`` with its own soft limit of 1 s."""
    return sleeper.run(path)


@app.task(soft_time_limit=1)
def soft_reader(path, port):
    """Blocks in a socket read from ``port`` (the test's listener never sends)."""
    _mark(path)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as connection:
        try:
            data = connection.recv(1)
        except SoftTimeLimitExceeded:
            return {"soft": True, "after": time.monotonic() - started}
    return {"soft": False, "data": data.decode()}


@app.task(soft_time_limit=1, time_limit=3)
async def async_sleeper(path, seconds=30, swallow=False):
    """An ``async def`` body: the soft limit comes at its await; one that swallows it goes
    on until the hard limit kills its process."""
    _mark(path)
    started = time.monotonic()
    try:
        await asyncio.sleep(seconds)
    except SoftTimeLimitExceeded:
        if swallow:
            await asyncio.sleep(seconds)
        return {"soft": True, "after": time.monotonic() - started}
    return {"soft": False}


class Hooked(app.Task):
    def on_failure(self, exc, task_id, args, kwargs, einfo):
        print(f"limitsproj-hook on_failure pid={os.getpid()} task_id={task_id} "
              f"exc={type(exc).__name__}", flush=True)


@app.task(base=Hooked, time_limit=1)
def hard_sleeper(path):
    """Outlives its hard limit: only killing its process stops it."""
    _mark(path)
    time.sleep(30)


@app.task
def big_result(size):
    """A result of ``size`` characters (over AKADZE_MAX_RESULT_BYTES in the tests)."""
    return "x" * size


@app.task(bind=True)
def whoami(self):
    return {"pid": os.getpid(), "retries": self.request.retries}


@task_revoked.connect
def on_task_revoked(sender=None, request=None, terminated=None, signum=None, expired=None,
                    **kwargs):
    print(f"limitsproj-signal task_revoked pid={os.getpid()} id={request.id} "
          f"terminated={terminated} signum={signum} expired={expired}", flush=True)


@task_failure.connect
def on_task_failure(sender=None, task_id=None, exception=None, **kwargs):
    print(f"limitsproj-signal task_failure pid={os.getpid()} id={task_id} "
          f"exception={type(exception).__name__}", flush=True)
