"""migration_guide/third-party.md tells the truth: its code blocks run, and what it says an
add-on lacks today is what the alias gives it (a claim that stops being true fails here, so
the page is updated with the code)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "migration_guide" / "third-party.md"
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [code for fence, code in FENCE.findall(GUIDE.read_text()) if fence == language]


def environment(alias: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "AKADZE_CELERY"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if alias is not None:
        env["AKADZE_CELERY"] = alias
    return env


def run(code: str, alias: str | None = "1",
        tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environment(alias), cwd=tmp or ROOT, timeout=120)


def test_the_page_has_its_blocks() -> None:
    assert len(blocks("python")) == 2 and len(blocks("sh")) == 1
    assert {fence for fence, _ in FENCE.findall(GUIDE.read_text())} <= {"python", "sh"}


@pytest.mark.parametrize("index", range(2))
def test_python_blocks_run_as_written(index: int, tmp_path: Path) -> None:
    # Without AKADZE_CELERY: each block switches the alias on by its first line.
    done = run(blocks("python")[index], alias=None, tmp=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_shell_block_prints_what_its_comment_says(tmp_path: Path) -> None:
    [block] = blocks("sh")
    done = subprocess.run(["bash", "-c", block], capture_output=True, text=True,
                          env=environment(None), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == block.split("#")[-1].strip() == "akadze_compat"


def test_the_django_structlog_step_is_created_as_the_worker_creates_steps(
        tmp_path: Path) -> None:
    pytest.importorskip("django_structlog")
    (tmp_path / "structlog_settings.py").write_text(textwrap.dedent("""
        SECRET_KEY = "test"
        INSTALLED_APPS = ["django_structlog"]
        DATABASES = {}
    """))
    done = run("""
        import json, os, sys
        sys.path.insert(0, os.getcwd())
        os.environ["DJANGO_SETTINGS_MODULE"] = "structlog_settings"
        import django
        django.setup()
        from celery import Celery, bootsteps, signals
        from django_structlog.celery.steps import DjangoStructLogInitStep

        app = Celery("proj", set_as_current=False)
        app.steps["worker"].add(DjangoStructLogInitStep)

        class Worker:
            steps = []

        before = signals.task_prerun.has_listeners()
        blueprint = bootsteps.Blueprint(app.steps["worker"]).apply(Worker())
        step = blueprint[DjangoStructLogInitStep.name]
        print(json.dumps([before, signals.task_prerun.has_listeners(),
                          type(step.receiver).__name__]))
    """, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '[false, true, "CeleryReceiver"]'
