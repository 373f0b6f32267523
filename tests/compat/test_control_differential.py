"""``app.control`` / ``inspect()`` replies have Celery 5.7's shapes: the same
calls (``control_probe.py``) against a real Celery worker on Redis and an akadze_compat worker
on Postgres, each ``-P threads -c 1`` with one task running, one reserved behind it and one
waiting for its eta; every reply's JSON shape (keys and value types) must match, except
where ``KNOWN_DIFFERENCES`` says why; an entry there that no longer differs fails too.

Skipped, with the reason, when Celery's interpreter (``CELERY_PYTHON``) or Redis
(``CONTROL_DIFF_REDIS_URL``, default ``redis://127.0.0.1:6379/12``) is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.compat import canvas_differential, differential
from tests.conftest import database_url_for

# Real worker processes (and a Celery worker): the first CI pass runs them.
pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("control_probe.py")
REDIS_URL = os.environ.get("CONTROL_DIFF_REDIS_URL", "redis://127.0.0.1:6379/12")
NODE = "ctl@probe"

#: Shape paths that differ, and why.
KNOWN_DIFFERENCES = {
    f"inspect.stats.{NODE}.broker.failover_strategy":
        "a database URL has no failover strategy (kombu's default is round-robin)",
    f"inspect.stats.{NODE}.broker.userid":
        "the database user is in the URL; the Redis URL has none",
    f"inspect.conf.{NODE}.worker_disable_prefetch": "a Celery 5.6+ worker option not in "
                                                    "akadze's settings",
    f"pool_grow[].{NODE}.ok": "akadze's threads pool grows; Celery's has no grow "
                              "(AttributeError)",
    f"pool_grow[].{NODE}.error": "the same, from Celery's side",
}
#: Replies that must be equal, not only alike in shape.
SAME_VALUES = [
    "control.ping", "inspect.ping", "inspect.registered", "inspect.registered(rate_limit)",
    "inspect(destination=str).ping", "inspect(destination=nobody).ping",
    "inspect(pattern).ping", "broadcast(custom)", "inspect._request(custom)",
    "broadcast(unknown)", "broadcast(reply=False)", "add_consumer",
    "active_queues after add_consumer", "cancel_consumer",
    "active_queues after cancel_consumer", "time_limit", "time_limit(unknown task)",
    "rate_limit(bad)", "inspect.revoked has the id", "reserved lists the waiting task",
    "shutdown", "worker exited after shutdown", "enable_events", "enable_events again",
    "disable_events", "disable_events again",
]


def _unavailable() -> str:
    reason = canvas_differential.celery_unavailable()
    if reason:
        return reason
    return canvas_differential.redis_reachable(REDIS_URL)


def _side(python: str, side: str, broker: str, out: Path,
          env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([python, str(PROBE), side, broker, str(out)], env=env,
                            cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def runs(admin_url: str, template_database: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any],
                                                                     dict[str, Any]]]:
    """(Celery's observations, ours), both probes run at once."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    name = f"control_diff_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)))
    try:
        directory = tmp_path_factory.mktemp("control-diff")
        clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        celery = _side(differential.celery_python(), "celery", REDIS_URL,
                       directory / "celery.json", clean)
        ours = _side(sys.executable, "akadze_compat", database_url_for(admin_url, name),
                     directory / "ours.json",
                     {**os.environ, "PYTHONPATH": str(differential.REPOSITORY)})
        theirs, mine = differential.probe_results(
            (celery, directory / "celery.json", "Celery control"),
            (ours, directory / "ours.json", "akadze_compat control"))
        yield theirs, mine
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def _differences(celery: Any, ours: Any, path: str) -> list[str]:
    """The shape paths where the two differ."""
    if isinstance(celery, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(celery) | set(ours)):
            if key not in celery or key not in ours:
                found.append(f"{path}.{key}")
            else:
                found += _differences(celery[key], ours[key], f"{path}.{key}")
        return found
    if isinstance(celery, list) and isinstance(ours, list):
        if celery and ours:
            return _differences(celery[0], ours[0], f"{path}[]")
        return [] if celery == ours else [path]
    return [] if celery == ours else [path]


def test_every_reply_has_celerys_shape(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    celery, ours = runs
    found = []
    for call in sorted(celery["shapes"]):
        found += _differences(celery["shapes"][call], ours["shapes"].get(call), call)
    unexplained = [path for path in found if path not in KNOWN_DIFFERENCES]
    assert unexplained == [], json.dumps(
        {path.split(".")[0]: [celery["replies"].get(path.split(".")[0]),
                              ours["replies"].get(path.split(".")[0])]
         for path in unexplained}, default=str, indent=1)[:6000]
    stale = sorted(set(KNOWN_DIFFERENCES) - set(found))
    assert stale == [], f"no longer different, drop from KNOWN_DIFFERENCES: {stale}"


@pytest.mark.parametrize("call", SAME_VALUES)
def test_reply_values_are_celerys(runs: tuple[dict[str, Any], dict[str, Any]],
                                  call: str) -> None:
    celery, ours = runs
    assert ours["replies"][call] == celery["replies"][call]


def test_rate_limit_replies_as_celery(
        runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    celery, ours = runs
    assert celery["replies"]["rate_limit"] == [{NODE: {"ok": "new rate limit set "
                                                             "successfully"}}]
    assert ours["replies"]["rate_limit"] == celery["replies"]["rate_limit"]
