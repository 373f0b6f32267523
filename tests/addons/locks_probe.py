"""celery-singleton and celery-once as their docs show them: a task with ``base=Singleton`` or
``base=QueueOnce``, called twice with the same arguments while the first call waits, then
again once it ran. ``python locks_probe.py BROKER BACKEND LOCKS_REDIS``; prints what each call
returned or raised, by kind (ids compared, not printed: they are random).
"""

from __future__ import annotations

import json
import sys
import time
import uuid

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery_once import AlreadyQueued, QueueOnce
from celery_singleton import DuplicateTaskError, Singleton, clear_locks

BROKER, BACKEND, LOCKS = sys.argv[1], sys.argv[2], sys.argv[3]
app = Celery("locks", broker=BROKER, backend=BACKEND, set_as_current=True)
prefix = uuid.uuid4().hex[:8]
app.conf.task_default_queue = f"locks-{prefix}"
# Both keep their locks in Redis: singleton's URL (else a redis:// result backend, else the
# broker's, which is Postgres on akadze), celery-once's ONCE setting.
app.conf.singleton_backend_url = LOCKS
app.conf.singleton_key_prefix = f"SINGLETONLOCK_{prefix}_"
app.conf.ONCE = {"backend": "celery_once.backends.Redis",
                 "settings": {"url": LOCKS, "default_timeout": 60}}


@app.task(base=Singleton, name="locks.single")
def single(x):
    return x * 2


@app.task(base=Singleton, name="locks.strict", raise_on_duplicate=True)
def strict(x):
    return x * 3


@app.task(base=QueueOnce, name=f"locks.once.{prefix}")
def once(x):
    return x * 4


@app.task(base=QueueOnce, name=f"locks.gentle.{prefix}", once={"graceful": True})
def gentle(x):
    return x * 5


def eventually(call, accepted=lambda sent: True):
    """``call()`` until it is accepted (at most 10 s): a lock is released just after the
    result that ``get()`` waited for is stored."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sent = call()
        except AlreadyQueued:
            sent = None
        if sent is not None and accepted(sent):
            return sent
        if time.monotonic() > deadline:
            raise SystemExit("the lock was never released")
        time.sleep(0.05)


report = {}
# Sent before any worker runs: the first call of each is queued and holds its lock.
first = single.delay(1)
again = single.delay(1)
other = single.delay(2)
report["singleton"] = {"duplicate_same_id": again.id == first.id,
                       "other_args_new_id": other.id != first.id}
strict.delay(1)
try:
    strict.delay(1)
    report["singleton_raise"] = "sent"
except DuplicateTaskError as exc:
    report["singleton_raise"] = type(exc).__name__
once_first = once.delay(1)
try:
    once.delay(1)
    report["once"] = "sent"
except AlreadyQueued as exc:
    report["once"] = type(exc).__name__
gentle_first = gentle.delay(1)
refused = gentle.delay(1)
report["once_graceful"] = {"type": type(refused).__name__, "state": refused.state,
                           "id": refused.id}
with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
    report["results"] = [first.get(timeout=30), other.get(timeout=30),
                         once_first.get(timeout=30), gentle_first.get(timeout=30)]
    # The runs release their locks (after their result is stored, in on_success and
    # after_return): the same calls are accepted again.
    report["singleton_after_run"] = eventually(
        lambda: single.delay(1), lambda sent: sent.id != first.id).get(timeout=30)
    report["once_after_run"] = eventually(lambda: once.delay(1)).get(timeout=30)
clear_locks(app)
print(json.dumps(report, sort_keys=True))
