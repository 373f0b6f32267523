"""Flower's HTTP API: real Flower 2.2 over Celery 5.7 + Redis against ``akadze-compat flower``
over Postgres, the same calls (``flower_probe.py``): every answer's status and JSON shape
(keys and value types) must match, except where ``KNOWN_DIFFERENCES`` says why (an entry
there that no longer differs fails too); the answers in ``SAME_VALUES`` must be equal.

Skipped, with the reason, when Flower's interpreter (``AKADZE_FLOWER_PYTHON``, else
``CELERY_PYTHON``, with flower installed) or Redis (``AKADZE_FLOWER_REDIS_URL``, default
``redis://127.0.0.1:6379/13``) is missing. (Not ``FLOWER_*``: the flower command reads
those as its options.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat import canvas_differential, differential
from tests.conftest import create_database, database_url_for, drop_database

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("flower_probe.py")
REDIS_URL = os.environ.get("AKADZE_FLOWER_REDIS_URL", "redis://127.0.0.1:6379/13")

#: Shape paths that differ, and why.
KNOWN_DIFFERENCES = {
    "tasks[1].flowerproj.add.worker": "a finished job no longer names its worker (the "
                                      "outcome clears worker_id): Flower lists it from "
                                      "the task's events",
    "tasks[1].flowerproj.boom.worker": "the same",
    "task info add[1].worker": "the same (null here)",
    "task info boom[1].worker": "the same (null here)",
    "pool grow[0]": "akadze's threads pool grows (200); Celery's has no grow (403)",
    "pool grow[1]": "the same: Flower's success message here, its failure text there",
    "pool shrink[0]": "the same, for shrink",
    "pool shrink[1]": "the same, for shrink",
}
#: Answers that must be equal, not only alike in shape.
SAME_VALUES = [
    "async-apply add", "async-apply boom", "send-task nap", "apply add", "tasks limit=1",
    "tasks taskname", "tasks state", "tasks workername", "tasks bad sort_by",
    "tasks bad received_start", "task types", "task info unknown", "task result add",
    "task result nap timeout", "async-apply unknown task", "async-apply args not a list",
    "workers", "workers one refreshed", "workers status", "workers unknown",
    "pool grow unknown worker", "add consumer", "cancel consumer",
    "add consumer without queue", "task timeout", "task timeout unknown task", "task revoke",
    "task abort", "shutdown",
]


def flower_python() -> str:
    """The interpreter with Celery and Flower installed."""
    return os.environ.get("AKADZE_FLOWER_PYTHON") or differential.celery_python()


def _unavailable() -> str:
    python = flower_python()
    if not Path(python).exists():
        return differential.no_celery_reason(python)
    found = subprocess.run([python, "-c", "import celery, flower, redis"],
                           capture_output=True, timeout=60, check=False)
    if found.returncode != 0:
        return (f"no Flower at {python}: pip install 'celery[redis]==5.7.*' 'flower==2.2.*' "
                "there, or set AKADZE_FLOWER_PYTHON")
    return canvas_differential.redis_reachable(REDIS_URL)


@pytest.fixture(scope="module")
def runs(admin_url: str, template_database: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any],
                                                                     dict[str, Any]]]:
    """(Flower's answers, ours), both probes run at once."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    name = create_database(admin_url, template_database)
    try:
        directory = tmp_path_factory.mktemp("flower-diff")
        clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

        def side(python: str, which: str, broker: str, env: dict[str, str]
                 ) -> subprocess.Popen[str]:
            return subprocess.Popen([python, str(PROBE), which, broker,
                                     str(directory / f"{which}.json")], env=env,
                                    cwd=directory, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        flower = side(flower_python(), "celery", REDIS_URL, clean)
        ours = side(sys.executable, "akadze_compat", database_url_for(admin_url, name),
                    {**os.environ, "PYTHONPATH": str(differential.REPOSITORY)})
        theirs, mine = differential.probe_results(
            (flower, directory / "celery.json", "Flower"),
            (ours, directory / "akadze_compat.json", "akadze_compat flower"))
        yield theirs, mine
    finally:
        drop_database(admin_url, name)


def _differences(flower: Any, ours: Any, path: str) -> list[str]:
    """The shape paths where the two differ (lists compared item by item: a [status,
    shape] pair)."""
    if isinstance(flower, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(flower) | set(ours)):
            if key not in flower or key not in ours:
                found.append(f"{path}.{key}")
            else:
                found += _differences(flower[key], ours[key], f"{path}.{key}")
        return found
    if isinstance(flower, list) and isinstance(ours, list) and len(flower) == len(ours):
        found = []
        for index, (one, other) in enumerate(zip(flower, ours, strict=True)):
            found += _differences(one, other, f"{path}[{index}]")
        return found
    return [] if flower == ours else [path]


def test_every_answer_has_flowers_status_and_shape(
        runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    flower, ours = runs
    assert sorted(ours["shapes"]) == sorted(flower["shapes"])
    found = []
    for call in sorted(flower["shapes"]):
        found += _differences(flower["shapes"][call], ours["shapes"][call], call)
    unexplained = [path for path in found if path not in KNOWN_DIFFERENCES]
    assert unexplained == [], json.dumps(
        {path: [flower["replies"].get(path.split("[")[0]), ours["replies"].get(
            path.split("[")[0])] for path in unexplained}, default=str, indent=1)[:6000]
    stale = sorted(set(KNOWN_DIFFERENCES) - set(found))
    assert stale == [], f"no longer different, drop from KNOWN_DIFFERENCES: {stale}"


@pytest.mark.parametrize("call", SAME_VALUES)
def test_answer_values_are_flowers(runs: tuple[dict[str, Any], dict[str, Any]],
                                   call: str) -> None:
    flower, ours = runs
    assert ours["replies"][call] == flower["replies"][call]


def test_task_fields_tell_the_same_story(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Beyond shapes: the states, args, result and exception of each task agree."""
    flower, ours = runs
    keys = ("name", "state", "args", "kwargs", "result", "exception", "retries")
    for name in ("flowerproj.add", "flowerproj.boom", "flowerproj.nap"):
        theirs = flower["replies"]["tasks"][1][name]
        mine = ours["replies"]["tasks"][1][name]
        assert {key: mine[key] for key in keys} == {key: theirs[key] for key in keys}, name
    assert ours["replies"]["task info nap"][1]["worker"] == "w1@probe"
    failure = ours["replies"]["task result boom"][1]
    assert failure["result"] == "ValueError('no luck')"
    assert "ValueError: no luck" in failure["traceback"]
