"""Run snippets under a real Celery interpreter, for differential tests.

The interpreter is ``differential.celery_python()``; tests that need it are skipped when it
does not have Celery installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from . import differential

ROOT = Path(__file__).resolve().parents[2]


def celery_python() -> str | None:
    """The interpreter with Celery, or None."""
    candidate = differential.celery_python()
    if not Path(candidate).exists():
        return None
    probe = subprocess.run([candidate, "-c", "import celery"], capture_output=True,
                           timeout=60, check=False)
    return candidate if probe.returncode == 0 else None


def run_celery(script: str) -> Any:
    """Run ``script`` (which prints one JSON document) under Celery; skip if unavailable."""
    python = celery_python()
    if python is None:
        pytest.skip(differential.no_celery_reason(differential.celery_python()))
    completed = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr)
        raise AssertionError(f"the Celery reference script failed:\n{completed.stderr}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
