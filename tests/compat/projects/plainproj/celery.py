"""The Celery app of plainproj, and the worker signal receivers it relies on."""

import os
import sys

from akadze_compat import Celery
from akadze_compat.signals import (
    celeryd_init,
    task_success,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

app = Celery("plainproj")
app.config_from_object("plainproj.celeryconfig")
app.autodiscover_tasks(["plainproj.billing", "plainproj.reports"])


@app.task(bind=True)
def debug_task(self):
    """Celery's classic sanity check: where and how am I running?"""
    return {"id": self.request.id, "hostname": self.request.hostname,
            "queue": self.request.delivery_info["queue"], "pid": os.getpid()}


def _say(name, **details):
    # Plain prints on stderr: visible before and after the worker sets logging up.
    text = " ".join(f"{key}={value}" for key, value in sorted(details.items()))
    print(f"plainproj-signal {name} pid={os.getpid()} {text}", file=sys.stderr, flush=True)


@celeryd_init.connect
def on_celeryd_init(sender=None, instance=None, conf=None, options=None, **kwargs):
    _say("celeryd_init", sender=sender, queue=conf.task_default_queue)


@worker_init.connect
def on_worker_init(sender=None, **kwargs):
    _say("worker_init", hostname=sender.hostname)


@worker_process_init.connect
def on_worker_process_init(sender=None, **kwargs):
    _say("worker_process_init", sender=sender)


@worker_ready.connect
def on_worker_ready(sender=None, **kwargs):
    _say("worker_ready", hostname=sender.hostname)


@worker_shutting_down.connect
def on_worker_shutting_down(sender=None, sig=None, how=None, exitcode=None, **kwargs):
    _say("worker_shutting_down", sender=sender, sig=sig, how=how)


@worker_process_shutdown.connect
def on_worker_process_shutdown(sender=None, pid=None, exitcode=None, **kwargs):
    _say("worker_process_shutdown", sender=sender, exitcode=exitcode)


@worker_shutdown.connect
def on_worker_shutdown(sender=None, **kwargs):
    _say("worker_shutdown", hostname=sender.hostname)


@task_success.connect
def on_task_success(sender=None, result=None, **kwargs):
    if sender.name == "plainproj.billing.tasks.add":
        _say("task_success", task=sender.name, result=result)
