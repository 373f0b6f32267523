"""celery-redbeat: its entries, written by RedBeat itself in its key layout, are imported once
into akadze's runtime schedules (``akadze-compat import-redbeat``); a project that keeps
RedBeat configured can still save its schedules (RedBeat's JSON of akadze's schedule
classes is Celery's)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from akadze_compat import Celery
from akadze_compat.bin.celery import cli as compat_cli
from akadze_compat.utils.time import humanize_seconds
from tests.addons.results_sides import HERE, on_akadze, on_celery
from tests.compat.differential import celery_python

pytestmark = pytest.mark.slow
REDIS = "redis://127.0.0.1:6379/14"


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    if importlib.util.find_spec("redis") is None:
        pytest.skip("the redis package is not installed here")
    import redis

    chosen = f"rbtest-{uuid.uuid4().hex[:8]}:"
    yield chosen
    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(match=chosen + "*"):
        client.delete(key)


def _written_by_redbeat(prefix: str) -> list[str]:
    """Run ``redbeat_writer.py`` with the real RedBeat (Celery's interpreter)."""
    python = celery_python()
    if not Path(python).exists() or subprocess.run(
            [python, "-c", "import redbeat"], capture_output=True).returncode != 0:
        pytest.skip(f"no celery-redbeat at {python}")
    done = subprocess.run([python, str(HERE / "redbeat_writer.py"), REDIS, prefix],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(done.stdout.strip().splitlines()[-1].strip("[]").replace('"', "")
                  .split(", "))


@pytest.fixture
def project_modules() -> Iterator[list[str]]:
    """Names of the project modules a test's commands import: forgotten, their apps'
    pools closed, afterwards (the next test writes its own under the same name)."""
    names: list[str] = []
    yield names
    for name in names:
        module = sys.modules.pop(name, None)
        app = getattr(module, "app", None)
        if app is not None:
            app.close()


def _project(tmp_path: Path, database_url: str, prefix: str) -> Path:
    (tmp_path / "rbproj.py").write_text(
        "from akadze_compat import Celery\n"
        f"app = Celery('rbproj', broker={database_url!r})\n"
        f"app.conf.redbeat_redis_url = {REDIS!r}\n"
        f"app.conf.redbeat_key_prefix = {prefix!r}\n"
        "app.conf.beat_schedule = {'static-ping': {'task': 'rb.ping', 'schedule': 60.0}}\n")
    return tmp_path


def test_import_redbeat_copies_the_runtime_entries(
        tmp_path: Path, database_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch,
        project_modules: list[str]) -> None:
    project_modules.append("rbproj")
    keys = _written_by_redbeat(prefix)
    assert keys == sorted(prefix + name for name in (
        "both-days", "by-rrule", "celery.backend_cleanup", "every-30s", "nightly", "routed",
        "static-ping", "switched-off"))
    monkeypatch.chdir(_project(tmp_path, database_url, prefix))
    runner = CliRunner()
    dry = runner.invoke(compat_cli, ["-A", "rbproj", "import-redbeat", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would import 4 RedBeat entries" in dry.output

    done = runner.invoke(compat_cli, ["-A", "rbproj", "import-redbeat"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == ("imported 4 RedBeat entries as runtime schedules: every-30s, routed, "
                        "switched-off, nightly")
    assert "left to beat_schedule in the code: static-ping" in lines
    assert "skipped by-rrule: its schedule (type 'rrule') has no runtime schedule form here" \
        in lines
    assert any(line.startswith("skipped both-days: a crontab restricting both") for line in lines)
    assert any(line.startswith("skipped celery.backend_cleanup:") for line in lines)

    app = Celery("check", broker=database_url, set_as_current=False)
    stored = {schedule.name: schedule for schedule in app.core.runtime_schedules.list()}
    assert sorted(stored) == ["every-30s", "nightly", "routed", "switched-off"]
    assert (stored["every-30s"].task, stored["every-30s"].trigger,
            dict(stored["every-30s"].args)) == ("rb.add", "every 30s",
                                                 {"args": [2, 3], "kwargs": {}})
    assert (stored["nightly"].trigger, dict(stored["nightly"].args)) == (
        "cron 15 3 * * * tz=UTC", {"args": [], "kwargs": {"kind": "daily"}})
    assert (stored["routed"].queue, stored["routed"].priority) == ("reports", 5)
    assert stored["switched-off"].paused and not stored["every-30s"].paused

    again = runner.invoke(compat_cli, ["-A", "rbproj", "import-redbeat"])
    assert again.exit_code == 0, again.output
    assert again.output.startswith("imported 0 RedBeat entries")
    assert "skipped every-30s: a runtime schedule of that name exists" in again.output
    replaced = runner.invoke(compat_cli, ["-A", "rbproj", "import-redbeat", "--replace"])
    assert replaced.output.startswith("imported 4 RedBeat entries"), replaced.output
    app.close()


def test_without_a_redis_url_the_command_says_what_to_give(
        tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch,
        project_modules: list[str]) -> None:
    project_modules.append("rbproj")
    (tmp_path / "rbproj.py").write_text(
        f"from akadze_compat import Celery\napp = Celery('rbproj', broker={database_url!r})\n")
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(compat_cli, ["-A", "rbproj", "import-redbeat"])
    assert done.exit_code != 0
    assert "give --redis-url" in done.output


def test_redbeat_encodes_akadzes_schedules_as_celerys() -> None:
    """Kept configured, RedBeat saves entries made with the project's ``celery.schedules``
    (akadze's, under the alias): no ``TypeError: schedule is not JSON serializable``."""
    needs = ("redbeat",)
    expected = on_celery("redbeat_encode_probe.py", needs=needs)
    assert on_akadze("redbeat_encode_probe.py", needs=needs) == expected


def test_humanize_seconds_matches_celerys() -> None:
    """celery-redbeat imports ``celery.utils.time.humanize_seconds``."""
    cases = [0, 0.004, 0.5, 1, 1.004, 59.999, 60, 61, 3599.99, 3600, 7200, 86400, 1e7]
    python = celery_python()
    if not Path(python).exists():
        pytest.skip(f"no Celery interpreter at {python}")
    code = ("import json; from celery.utils.time import humanize_seconds as h; "
            f"print(json.dumps([[h(c) for c in {cases}], "
            f"[h(c, prefix='in ', microseconds=True) for c in {cases}]]))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        [humanize_seconds(c) for c in cases],
        [humanize_seconds(c, prefix="in ", microseconds=True) for c in cases]]
