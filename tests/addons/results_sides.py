"""Running one add-on probe on both sides: Celery 5.7 (``$CELERY_PYTHON``) and akadze.

A probe is a script in this directory, written as the add-on's docs show it (``import
celery``...), that prints one JSON line of what the add-on observed. On the Celery side it
runs in the Celery interpreter; on akadze's, in this interpreter with ``AKADZE_CELERY=1``,
so that ``celery`` resolves to akadze_compat and the probe's code stays the same. A side
whose packages are missing skips the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.compat.differential import celery_python, no_celery_reason

HERE = Path(__file__).parent
TIMEOUT = 180


def _has(python: str, modules: tuple[str, ...]) -> bool:
    try:
        found = subprocess.run([python, "-c", "; ".join(f"import {name}" for name in modules)],
                               capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0


def _run(python: str, script: str, args: tuple[str, ...], env: dict[str, str]) -> Any:
    done = subprocess.run([python, str(HERE / script), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=HERE, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def on_celery(script: str, *args: str, needs: tuple[str, ...] = ()) -> Any:
    """The probe's JSON on Celery 5.7."""
    python = celery_python()
    if not Path(python).exists():
        pytest.skip(no_celery_reason(python))
    if not _has(python, ("celery", *needs)):
        pytest.skip(f"{python} lacks {', '.join(needs)}: pip install them there")
    return _run(python, script, args, {"AKADZE_CELERY": ""})


def on_akadze(script: str, *args: str, needs: tuple[str, ...] = ()) -> Any:
    """The probe's JSON on akadze: the same code, ``celery`` resolved to akadze_compat."""
    if importlib.util.find_spec("akadze_compat.as_celery") is None:
        pytest.skip("the celery alias (akadze_compat.as_celery) is not in this checkout")
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)} (the test extra pins them)")
    return _run(sys.executable, script, args, {"AKADZE_CELERY": "1"})
