"""The migration guide stays true: generated tables up to date, relative links resolving."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat import differential

PROJECT_ROOT = Path(__file__).resolve().parents[2]
GUIDE = PROJECT_ROOT / "migration_guide"
GENERATOR = GUIDE / "tools" / "celery_tables.py"
DOCUMENTS = [PROJECT_ROOT / "README.md", *sorted(GUIDE.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_generated_tables_are_up_to_date() -> None:
    """celery-settings.md and celery-api.md match what the generator writes today (it
    needs Celery 5.7 in its own interpreter, like the differential tests)."""
    python = differential.celery_python()
    if not Path(python).is_file():
        pytest.skip(differential.no_celery_reason(python))
    completed = subprocess.run([sys.executable, str(GENERATOR), "--check",
                                "--celery-python", python], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=300)
    if "No module named 'celery'" in completed.stderr:
        pytest.skip(f"{python} cannot import celery")
    assert completed.returncode == 0, (
        "the Celery tables of the migration guide are stale or a note is wrong; run "
        f"`python migration_guide/tools/celery_tables.py`:\n{completed.stderr}")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{document.name}: links to missing files {broken}"
