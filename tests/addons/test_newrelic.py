"""The New Relic agent's Celery instrumentation, set up as its docs show
(``newrelic.agent.initialize()`` first thing in the project, settings from the environment),
in developer mode (a fake collector in the process: nothing leaves the machine), with the
agent's own record of each finished transaction written to a file: a background
transaction per task, named after it, the failed one with its error. The same on Celery
5.7 + Redis and on akadze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.addons.harness import Run, celery_side_python, require, run_project

OBSERVE = '''
import newrelic.agent
from newrelic.core.agent import Agent

_record = Agent.record_transaction


def record_transaction(self, app_name, data):
    """What the agent records for each finished transaction (to harvest later)."""
    emit({"kind": "transaction", "path": data.path, "background": data.type == "OtherTransaction",
          "errors": [(error.type, error.message) for error in data.errors]})
    return _record(self, app_name, data)


Agent.record_transaction = record_transaction
newrelic.agent.initialize()


def producer_span():
    import contextlib
    return contextlib.nullcontext()


def producer_facts():
    return {}


def finish():
    pass
'''

ENV = {"NEW_RELIC_DEVELOPER_MODE": "true", "NEW_RELIC_APP_NAME": "proj",
       "NEW_RELIC_LICENSE_KEY": "0" * 40, "NEW_RELIC_STARTUP_TIMEOUT": "10",
       "NEW_RELIC_LOG": "stderr", "NEW_RELIC_LOG_LEVEL": "warning"}


def facts(run: Run) -> dict[str, Any]:
    """The tasks' transactions, where they ran and what they recorded."""
    return {
        "producer": (run.producer["value"], run.producer["error"]),
        "transactions": sorted(
            (record["path"], record["background"], [tuple(error) for error in record["errors"]],
             record["pid"] != run.worker_pid and record["pid"] != run.producer["pid"])
            for record in run.of("transaction") if "/Celery/" in record["path"]),
    }


EXPECTED = {
    "producer": (42, "ValueError"),
    # (path, background, errors, in a pool child)
    "transactions": [
        ("OtherTransaction/Celery/proj.boom", True,
         [("builtins:ValueError", "boom from the task")], True),
        ("OtherTransaction/Celery/proj.double", True, [], True),
    ],
}


def test_akadze(tmp_path: Path, module_database_url: str) -> None:
    require("newrelic.agent")
    assert facts(run_project(tmp_path, "akadze", OBSERVE, database_url=module_database_url,
                             env=ENV)) == EXPECTED


def test_celery(tmp_path: Path) -> None:
    """The reference: what the same project shows on Celery, the figures above."""
    python = celery_side_python("newrelic.agent")
    assert facts(run_project(tmp_path, "celery", OBSERVE, celery=python, env=ENV)) == EXPECTED
