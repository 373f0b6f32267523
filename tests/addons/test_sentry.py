"""sentry-sdk's CeleryIntegration, set up as Sentry's docs show (``sentry_sdk.init`` in
``celeryd_init`` for the worker, at start-up for the producer), with a transport that
writes what would be sent to a file: an error in a task becomes an event with its Celery
context, sent from the prefork child that ran it; each task is a transaction in the
producer's trace. The same on Celery 5.7 + Redis and on akadze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.addons.harness import Run, celery_side_python, require, run_project

OBSERVE = '''
import sentry_sdk
from celery import signals
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport


class LocalTransport(Transport):
    """Writes what Sentry would send; nothing leaves the machine."""

    def capture_envelope(self, envelope):
        for item in envelope.items:
            payload = item.payload.json
            if item.type == "event":
                [exception] = payload["exception"]["values"][-1:]
                emit({"kind": "event", "type": exception["type"],
                      "value": exception["value"],
                      "mechanism": exception.get("mechanism", {}).get("type"),
                      "task_id": payload.get("tags", {}).get("celery_task_id"),
                      "task_name": payload.get("extra", {}).get("celery-job", {})
                      .get("task_name"),
                      "trace_id": payload["contexts"]["trace"]["trace_id"]})
            elif item.type == "transaction":
                trace = payload["contexts"]["trace"]
                emit({"kind": "transaction", "name": payload["transaction"],
                      "op": trace.get("op"), "status": trace.get("status"),
                      "trace_id": trace["trace_id"],
                      "spans": sorted(span.get("op") for span in payload["spans"]
                                      if span.get("op") == "queue.submit.celery")})


def init():
    sentry_sdk.init(dsn="http://public@127.0.0.1:9/1", transport=LocalTransport(),
                    integrations=[CeleryIntegration()], traces_sample_rate=1.0)


@signals.celeryd_init.connect
def init_sentry(**_kwargs):
    init()


_started = []


def producer_span():
    init()
    transaction = sentry_sdk.start_transaction(op="test", name="producer")
    _started.append(transaction)
    return transaction


def producer_facts():
    return {"trace_id": _started[0].trace_id}


def finish():
    sentry_sdk.flush()
'''


def facts(run: Run) -> dict[str, Any]:
    """What Sentry saw, in terms both sides share."""
    producer = run.producer
    trace_id = producer["trace_id"]
    [event] = run.of("event")
    tasks = sorted((record for record in run.of("transaction") if record["name"] != "producer"),
                   key=lambda record: record["name"])
    [sent] = [record for record in run.of("transaction") if record["name"] == "producer"]
    return {
        "producer": (producer["value"], producer["error"]),
        "event": (event["type"], event["value"], event["mechanism"], event["task_name"],
                  event["task_id"] == producer["boom_id"], event["trace_id"] == trace_id,
                  event["pid"] != run.worker_pid),
        "task transactions": [(record["name"], record["op"], record["status"],
                               record["trace_id"] == trace_id, record["pid"] != run.worker_pid)
                              for record in tasks],
        "producer spans": sent["spans"],
    }


EXPECTED = {
    "producer": (42, "ValueError"),
    # From the prefork child that ran the task, in the producer's trace.
    "event": ("ValueError", "boom from the task", "celery", "proj.boom", True, True, True),
    "task transactions": [("proj.boom", "queue.task.celery", "internal_error", True, True),
                          ("proj.double", "queue.task.celery", "ok", True, True)],
    # apply_async's and send_task's, per send. (Celery's also has kombu's "queue.publish"
    # spans, of Producer.publish, which akadze does not publish through.)
    "producer spans": ["queue.submit.celery"] * 4,
}


def test_akadze(tmp_path: Path, module_database_url: str) -> None:
    require("sentry_sdk.integrations.celery")
    assert facts(run_project(tmp_path, "akadze", OBSERVE,
                             database_url=module_database_url)) == EXPECTED


def test_celery(tmp_path: Path) -> None:
    """The reference: what the same project shows on Celery, the figures above."""
    python = celery_side_python("sentry_sdk.integrations.celery")
    assert facts(run_project(tmp_path, "celery", OBSERVE, celery=python)) == EXPECTED


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DSN points at a closed local port; the transport never uses it anyway."""
    monkeypatch.delenv("SENTRY_DSN", raising=False)
