"""opentelemetry-instrumentation-celery, set up as its docs show (``CeleryInstrumentor()
.instrument()`` in ``worker_process_init``), with an exporter that writes the finished spans
to a file: the producer's span and the consumer's, one trace, and a failed task's span with
the error status. The same on Celery 5.7 + Redis and on akadze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.addons.harness import Run, celery_side_python, require, run_project

OBSERVE = '''
from celery.signals import worker_process_init
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    """Keeps the spans here (an in-memory exporter that outlives the process)."""

    def export(self, spans):
        for span in spans:
            emit({"kind": "span", "name": span.name, "span_kind": span.kind.name,
                  "trace_id": format(span.context.trace_id, "032x"),
                  "span_id": format(span.context.span_id, "016x"),
                  "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                  "status": span.status.status_code.name,
                  "description": span.status.description})
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def setup():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


@worker_process_init.connect(weak=False)
def init_celery_tracing(*args, **kwargs):
    setup()


_root = []


def producer_span():
    setup()
    span = trace.get_tracer("producer").start_as_current_span("producer")
    _root.append(span)
    return span


def producer_facts():
    return {}


def finish():
    trace.get_tracer_provider().shutdown()
'''


def facts(run: Run) -> dict[str, Any]:
    """The spans' shape: names, kinds, who is whose parent, one trace, statuses."""
    spans = run.of("span")
    [root] = [span for span in spans if span["name"] == "producer"]
    by_id = {span["span_id"]: span for span in spans}

    def parent_name(span: dict[str, Any]) -> str | None:
        parent = by_id.get(span["parent_id"]) if span["parent_id"] else None
        return parent["name"] if parent else None

    return {
        "producer": (run.producer["value"], run.producer["error"]),
        "spans": sorted((span["name"], span["span_kind"], parent_name(span),
                         span["trace_id"] == root["trace_id"], span["status"],
                         span["pid"] != run.worker_pid and span["pid"] != run.producer["pid"])
                        for span in spans),
        "failure": [span["description"] for span in spans
                    if span["name"] == "run/proj.boom"],
    }


EXPECTED = {
    "producer": (42, "ValueError"),
    # (name, kind, parent's name, in the producer's trace, status, in a pool child)
    "spans": [
        ("apply_async/proj.boom", "PRODUCER", "producer", True, "UNSET", False),
        ("apply_async/proj.double", "PRODUCER", "producer", True, "UNSET", False),
        ("producer", "INTERNAL", None, True, "UNSET", False),
        ("run/proj.boom", "CONSUMER", "apply_async/proj.boom", True, "ERROR", True),
        ("run/proj.double", "CONSUMER", "apply_async/proj.double", True, "UNSET", True),
    ],
    "failure": ["boom from the task"],
}


def test_akadze(tmp_path: Path, module_database_url: str) -> None:
    require("opentelemetry.instrumentation.celery", "opentelemetry.sdk")
    assert facts(run_project(tmp_path, "akadze", OBSERVE,
                             database_url=module_database_url)) == EXPECTED


def test_celery(tmp_path: Path) -> None:
    """The reference: what the same project shows on Celery, the figures above."""
    python = celery_side_python("opentelemetry.instrumentation.celery", "opentelemetry.sdk")
    assert facts(run_project(tmp_path, "celery", OBSERVE, celery=python)) == EXPECTED
