"""django-structlog with its Celery extra, set up as its docs show:
``DJANGO_STRUCTLOG_CELERY_ENABLED`` and ``RequestMiddleware`` in the Django settings,
``app.steps['worker'].add(DjangoStructLogInitStep)`` and a ``setup_logging`` receiver that
sends structlog's lines to a JSON file.

A request to a Django view (Django's test client, through the middleware, which binds a
``request_id``) sends four tasks; one of them sends a fifth from the worker, another retries.
The add-on puts the sender's context in the message (its ``__django_structlog__`` header)
and the receivers its boot step connects bind it again when a task starts, in the prefork
child that runs it, so every line a task logs carries the request's ``request_id`` (and the
sending task's id as ``parent_task_id``), with the ``task_started``, ``task_succeeded``,
``task_failed`` and ``task_retrying`` events. The JSON lines of the worker and of the web
process are the same on Celery 5.7 + Redis and on akadze.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.addons.harness import Run, celery_side_python, require, run_project

MODULES = ("django", "structlog", "django_structlog.celery.steps")

SETTINGS = '''
SECRET_KEY = "not-a-secret"
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = ["django_structlog"]
MIDDLEWARE = ["django_structlog.middlewares.RequestMiddleware"]
ROOT_URLCONF = "urls"
DATABASES = {}
USE_TZ = True
DJANGO_STRUCTLOG_CELERY_ENABLED = True
'''

URLS = '''
import structlog
from django.http import JsonResponse
from django.urls import path

from proj import boom, double, fanout, flaky

logger = structlog.get_logger("proj.views")


def enqueue(request):
    logger.info("enqueueing")
    ok, failed, parent, retried = double.delay(21), boom.delay(), fanout.delay(), flaky.delay()
    return JsonResponse({"request_id": structlog.contextvars.get_contextvars()["request_id"],
                         "ok_id": ok.id, "boom_id": failed.id, "fanout_id": parent.id,
                         "flaky_id": retried.id})


urlpatterns = [path("enqueue/", enqueue)]
'''

PROJECT = '''
import logging.config
import os

import django
import structlog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from celery import Celery  # noqa: E402
from celery.signals import setup_logging  # noqa: E402
from django_structlog.celery.steps import DjangoStructLogInitStep  # noqa: E402

app = Celery("proj", broker=os.environ["PROJ_BROKER"],
             backend=os.environ.get("PROJ_BACKEND") or None)
app.conf.task_default_queue = os.environ["PROJ_QUEUE"]

# A step to initialize django-structlog
app.steps["worker"].add(DjangoStructLogInitStep)


@setup_logging.connect
def receiver_setup_logging(loglevel, logfile, format, colorize, **kwargs):
    logging.config.dictConfig({
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json_formatter": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processor": structlog.processors.JSONRenderer(),
            },
            "plain_console": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processor": structlog.dev.ConsoleRenderer(colors=False),
            },
        },
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "plain_console"},
            "json_file": {
                "class": "logging.handlers.WatchedFileHandler",
                "filename": os.environ.get("PROJ_STRUCTLOG", "structlog-worker.json"),
                "formatter": "json_formatter",
            },
        },
        # The worker's own lines ("ready.") on the console; the structured ones also in JSON.
        "root": {"handlers": ["console"], "level": "INFO"},
        "loggers": {
            "django_structlog": {"handlers": ["json_file"], "level": "INFO"},
            "proj": {"handlers": ["json_file"], "level": "INFO"},
        },
    })
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


logger = structlog.get_logger("proj.tasks")


@app.task(name="proj.double")
def double(x):
    logger.info("doubling", x=x)
    return x * 2


@app.task(name="proj.boom")
def boom():
    logger.info("about_to_fail")
    raise ValueError("boom from the task")


@app.task(name="proj.fanout")
def fanout():
    return double.delay(4).id


@app.task(name="proj.flaky", bind=True, max_retries=1)
def flaky(self):
    if not self.request.retries:
        raise self.retry(exc=KeyError("once"), countdown=0)
    return "again"
'''

PRODUCER = '''
import logging
import os

os.environ["PROJ_STRUCTLOG"] = "structlog-producer.json"

import observe  # noqa: E402
import proj  # noqa: E402
from django.test import Client  # noqa: E402

# The web process's logging: the same configuration, its own file.
proj.receiver_setup_logging(loglevel=logging.INFO, logfile=None, format="", colorize=False)

sent = Client().get("/enqueue/").json()
value = proj.double.AsyncResult(sent["ok_id"]).get(timeout=60)
try:
    proj.boom.AsyncResult(sent["boom_id"]).get(timeout=60)
    error = None
except Exception as exc:
    error = type(exc).__name__
child_id = proj.fanout.AsyncResult(sent["fanout_id"]).get(timeout=60)
child_value = proj.double.AsyncResult(child_id).get(timeout=60)
retried = proj.flaky.AsyncResult(sent["flaky_id"]).get(timeout=60)
observe.emit({"role": "producer", **sent, "value": value, "error": error,
              "child_id": child_id, "child_value": child_value, "retried": retried})
'''

OBSERVE = ""


def facts(run: Run) -> dict[str, Any]:
    """The structured lines of the web process and of the worker, each without its time,
    with this run's ids replaced by what they are (the request's, or the task's name in the
    project), sorted."""
    producer = run.producer
    assert run.directory is not None
    names = {producer["ok_id"]: "double", producer["boom_id"]: "boom",
             producer["fanout_id"]: "fanout", producer["child_id"]: "child",
             producer["flaky_id"]: "flaky", producer["request_id"]: "REQUEST"}

    def line(entry: dict[str, Any]) -> dict[str, Any]:
        entry.pop("timestamp")
        for key in ("request_id", "task_id", "parent_task_id", "child_task_id"):
            if key in entry:
                entry[key] = names.get(entry[key], entry[key])
        if isinstance(entry.get("duration_ms"), int):
            entry["duration_ms"] = "int"
        if str(entry.get("routing_key")).startswith("addons_"):
            entry["routing_key"] = "QUEUE"
        if "exception" in entry:  # the traceback's last line
            entry["exception"] = entry["exception"].strip().splitlines()[-1]
        return entry

    def lines(name: str) -> list[dict[str, Any]]:
        return sorted((line(json.loads(text)) for text in
                       (run.directory / name).read_text().splitlines()), key=_order)

    return {"producer": (producer["value"], producer["error"], producer["child_value"],
                         producer["retried"]),
            "web": lines("structlog-producer.json"), "worker": lines("structlog-worker.json")}


def _order(entry: dict[str, Any]) -> str:
    return json.dumps(entry, sort_keys=True)


RECEIVERS = "django_structlog.celery.receivers"
MIDDLEWARE = "django_structlog.middlewares.request"


def _line(event: str, logger: str = RECEIVERS, level: str = "info",
          **fields: Any) -> dict[str, Any]:
    """A line bound to the request's context (its id and the client's address)."""
    return {"event": event, "logger": logger, "level": level, "ip": "127.0.0.1",
            "request_id": "REQUEST", **fields}


def _sent(name: str, **fields: Any) -> dict[str, Any]:
    return _line("task_enqueued", child_task_id=name,
                 child_task_name=f"proj.{'double' if name == 'child' else name}",
                 routing_key="QUEUE", **fields)


EXPECTED = {
    "producer": (42, "ValueError", 8, "again"),
    "web": sorted([
        _line("request_started", MIDDLEWARE, request="GET /enqueue/", user_agent=None),
        _line("enqueueing", "proj.views"),
        _sent("double"), _sent("boom"), _sent("fanout"), _sent("flaky"),
        _line("request_finished", MIDDLEWARE, request="GET /enqueue/", code=200),
    ], key=_order),
    "worker": sorted([
        _line("task_started", task="proj.double", task_id="double"),
        _line("doubling", "proj.tasks", task_id="double", x=21),
        _line("task_succeeded", task_id="double", duration_ms="int"),
        _line("task_started", task="proj.boom", task_id="boom"),
        _line("about_to_fail", "proj.tasks", task_id="boom"),
        _line("task_failed", level="error", task_id="boom", duration_ms="int",
              error="boom from the task", exception="ValueError: boom from the task"),
        _line("task_started", task="proj.fanout", task_id="fanout"),
        # Sent from a task: the add-on's receivers are connected twice in the worker (by
        # its Django app when Django is set up, and by the boot step), on Celery too.
        *[_sent("child", task_id="fanout")] * 2,
        _line("task_succeeded", task_id="fanout", duration_ms="int"),
        # The task a task sent: the request's id still, and its sender as parent_task_id.
        _line("task_started", task="proj.double", task_id="child", parent_task_id="fanout"),
        _line("doubling", "proj.tasks", task_id="child", parent_task_id="fanout", x=4),
        _line("task_succeeded", task_id="child", parent_task_id="fanout", duration_ms="int"),
        # A retry is sent again (with the message's priority), so its second run has
        # itself as parent_task_id.
        _line("task_started", task="proj.flaky", task_id="flaky"),
        *[_sent("flaky", task_id="flaky", priority=0)] * 2,
        _line("task_retrying", level="warning", task_id="flaky",
              reason="Retry(Retry(...), KeyError('once'), 0)"),
        _line("task_started", task="proj.flaky", task_id="flaky", parent_task_id="flaky"),
        _line("task_succeeded", task_id="flaky", parent_task_id="flaky", duration_ms="int"),
    ], key=_order),
}

FILES = {"settings.py": SETTINGS, "urls.py": URLS, "proj.py": PROJECT, "producer.py": PRODUCER}


def test_akadze(tmp_path: Path, module_database_url: str) -> None:
    require(*MODULES)
    assert facts(run_project(tmp_path, "akadze", OBSERVE, database_url=module_database_url,
                             files=FILES)) == EXPECTED


def test_celery(tmp_path: Path) -> None:
    """The reference: what the same project shows on Celery, the figures above."""
    python = celery_side_python(*MODULES)
    assert facts(run_project(tmp_path, "celery", OBSERVE, celery=python,
                             files=FILES)) == EXPECTED
