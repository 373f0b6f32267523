"""ddtrace's Celery integration, set up as its docs show (``patch(celery=True)`` before the
app is made, distributed tracing on with ``DD_CELERY_DISTRIBUTED_TRACING``), with a trace
filter that writes each finished trace to a file and drops it (the agent URL is a closed
local port): a ``celery.run`` span per task in the producer's trace, the failed one marked
as an error. The same on Celery 5.7 + Redis and on akadze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.addons.harness import Run, celery_side_python, require, run_project

OBSERVE = '''
from ddtrace import patch

patch(celery=True)

from ddtrace.trace import TraceFilter, tracer  # noqa: E402


class LocalWriter(TraceFilter):
    """Writes each finished trace here and drops it: nothing goes to an agent."""

    def process_trace(self, trace):
        for span in trace:
            emit({"kind": "span", "name": span.name, "resource": span.resource,
                  "trace_id": str(span.trace_id), "error": span.error,
                  "message": span.get_tag("error.message")})
        return None


tracer.configure(trace_processors=[LocalWriter()])
_root = []


def producer_span():
    span = tracer.trace("producer")
    _root.append(span)
    return span


def producer_facts():
    return {"trace_id": str(_root[0].trace_id)}


def finish():
    tracer.flush()
'''

ENV = {"DD_CELERY_DISTRIBUTED_TRACING": "true", "DD_TRACE_AGENT_URL": "http://127.0.0.1:9",
       "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false", "DD_REMOTE_CONFIGURATION_ENABLED": "false",
       "DD_TRACE_STARTUP_LOGS": "false"}


def facts(run: Run) -> dict[str, Any]:
    """The spans of the tasks, whether they are in the producer's trace, and the error."""
    trace_id = run.producer["trace_id"]
    spans = [span for span in run.of("span") if span["name"].startswith("celery.")]
    return {
        "producer": (run.producer["value"], run.producer["error"]),
        "spans": sorted((span["name"], span["resource"], span["trace_id"] == trace_id,
                         span["error"], span["pid"] != run.worker_pid
                         and span["pid"] != run.producer["pid"]) for span in spans),
        "error": [span["message"] for span in spans
                  if span["name"] == "celery.run" and span["error"]],
    }


EXPECTED = {
    "producer": (42, "ValueError"),
    # (name, resource, in the producer's trace, error, in a pool child)
    "spans": [("celery.apply", "proj.boom", True, 0, False),
              ("celery.apply", "proj.double", True, 0, False),
              ("celery.run", "proj.boom", True, 1, True),
              ("celery.run", "proj.double", True, 0, True)],
    "error": ["boom from the task"],
}


def test_akadze(tmp_path: Path, module_database_url: str) -> None:
    require("ddtrace.contrib.internal.celery")
    assert facts(run_project(tmp_path, "akadze", OBSERVE, database_url=module_database_url,
                             env=ENV)) == EXPECTED


def test_celery(tmp_path: Path) -> None:
    """The reference: what the same project shows on Celery, the figures above."""
    python = celery_side_python("ddtrace.contrib.internal.celery")
    assert facts(run_project(tmp_path, "celery", OBSERVE, celery=python, env=ENV)) == EXPECTED
