"""Canvas programs give the same values, states, exceptions and errback calls under Celery 5.7
(Redis broker and result backend) and under akadze_compat (Postgres).

The programs are ``canvas_corpus.py``; ``canvas_differential.py`` runs them once per side per
module, both sides at once, each with one real worker (``celery worker -P threads -c 4`` and
``akadze-compat worker -P threads -c 4``). Each program's observation is compared field by
field; a field may differ only when ``KNOWN_DIFFERENCES`` says why, and an entry there that
no longer differs fails too, so the table stays true.

Skipped, with the reason, when Celery's interpreter (``CELERY_PYTHON``, default
``/tmp/akadze-celery-venv``) or Redis (``CANVAS_DIFF_REDIS_URL``, default
``redis://127.0.0.1:6379/11``) is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.compat import canvas_differential as diff
from tests.compat.canvas_differential import ANY, KNOWN_DIFFERENCES
from tests.conftest import database_url_for

PROGRAMS = diff.program_names()


#: The message prefix of akadze_compat's canvas before it had one (``canvas._unsupported``).
NOT_YET = "canvas: "


@pytest.fixture(scope="module")
def runs(admin_url: str, template_database: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any],
                                                                     dict[str, Any]]]:
    """(Celery's run, ours): both sides at once, each on its own worker."""
    reason = diff.celery_unavailable()
    if reason:
        pytest.skip(reason)
    name = f"canvas_diff_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_database)))
    try:
        directory = tmp_path_factory.mktemp("canvas-diff")
        celery = diff.start_side("celery", directory / "celery")
        ours = diff.start_side("akadze_compat", directory / "akadze_compat",
                               database_url=database_url_for(admin_url, name))
        yield celery.result(), ours.result()
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def _report(differences: dict[str, tuple[Any, Any]],
            names: tuple[str, str] = ("celery", "akadze_compat")) -> str:
    width = max(map(len, names)) + 1
    return "\n".join(f"  {path or '(all)'}:\n    {names[0] + ':':{width}} {json.dumps(left)}\n"
                     f"    {names[1] + ':':{width}} {json.dumps(right)}"
                     for path, (left, right) in differences.items())


def test_the_corpus_is_migrated_the_way_a_user_migrates() -> None:
    """Only the ``celery`` import lines change between the two sides' sources."""
    celery, ours = diff.corpus_source("celery").splitlines(), diff.corpus_source(
        "akadze_compat").splitlines()
    assert len(celery) == len(ours)
    changed = [(a, b) for a, b in zip(celery, ours, strict=True) if a != b]
    assert changed and all("celery" in a and "akadze_compat" in b for a, b in changed)
    assert all(a.lstrip().startswith(("from celery", "import celery")) for a, _ in changed)
    assert diff.rename_celery_imports("import celery.result\nfrom celery import chain\n") == (
        "import akadze_compat.result as celery\nfrom akadze_compat import chain\n")
    assert len(PROGRAMS) >= 30


def test_every_difference_has_a_program() -> None:
    assert set(KNOWN_DIFFERENCES) <= set(PROGRAMS)


def test_the_canvas_page_of_the_migration_guide_is_up_to_date() -> None:
    """``migration_guide/celery-canvas.md`` is generated from the recorded observations and
    the documented differences (``python -m tests.compat.canvas_differential --page``)."""
    assert diff.PAGE.read_text("utf-8") == diff.render_page(), (
        "stale: run `python -m tests.compat.canvas_differential --page`")


@pytest.mark.slow
def test_celery_still_does_what_was_recorded(runs: tuple[dict[str, Any], dict[str, Any]]) \
        -> None:
    """``canvas_celery_observations.json`` is what Celery does today (rewrite it with
    ``python -m tests.compat.canvas_differential --record`` when the corpus changes)."""
    celery, _ = runs
    recorded = json.loads(Path(diff.RECORDED).read_text("utf-8"))["programs"]
    changed = {name: diff.differences(recorded.get(name), observed)
               for name, observed in celery["programs"].items()
               if recorded.get(name) != observed}
    assert not changed, "Celery's observations differ from the recorded ones:\n" + "\n".join(
        f"{name}:\n{_report(fields, ('recorded', 'live'))}" for name, fields in changed.items())
    assert set(recorded) == set(celery["programs"])


@pytest.mark.slow
@pytest.mark.parametrize("name", PROGRAMS)
def test_same_as_celery(name: str, runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    celery, ours = (run["programs"][name] for run in runs)
    for side, observed in (("celery", celery), ("akadze_compat", ours)):
        assert "setup_error" not in observed or side == "akadze_compat", observed
    error = ours.get("program_error") or ours.get("setup_error")
    if error and error["type"] == "NotImplementedError" and error["message"].startswith(
            NOT_YET):
        pytest.xfail(f"akadze_compat has no canvas yet: {error['message']}")
    found = diff.differences(celery, ours)
    allowed = KNOWN_DIFFERENCES.get(name, {})
    unexplained = {path: values for path, values in found.items()
                   if not any(diff.covered(path, prefix) for prefix in allowed)}
    stale = [prefix for prefix in allowed if not any(diff.covered(path, prefix) for path in found)]
    pinned = {prefix: (known.ours, diff.value_at(ours, prefix))
              for prefix, known in allowed.items()
              if known.ours is not ANY and diff.value_at(ours, prefix) != known.ours}
    tracebacks = runs[1]["meta"]["tracebacks"]
    assert not unexplained, (
        f"{name}: akadze_compat differs from Celery 5.7:\n{_report(unexplained)}"
        + (f"\nour traceback:\n{tracebacks[name]}" if name in tracebacks else ""))
    assert not pinned, (f"{name}: a documented difference, but akadze_compat does not give "
                        f"what KNOWN_DIFFERENCES says:\n"
                        f"{_report(pinned, ('documented', 'akadze_compat'))}")
    assert not stale, (f"{name}: documented differences no longer seen, remove them from "
                       f"KNOWN_DIFFERENCES: {stale}")
