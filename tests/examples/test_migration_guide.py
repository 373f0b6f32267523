"""The migration guide and docs/ stay true: generated tables up to date, relative links
resolving, dotted names existing."""

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
DOCUMENTS = [PROJECT_ROOT / "README.md", *sorted(GUIDE.glob("*.md")),
             *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _name(path: Path) -> str:
    return path.relative_to(PROJECT_ROOT).as_posix()


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


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: _name(path))
def test_relative_links_resolve(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{document.name}: links to missing files {broken}"


def test_commands_the_guide_calls_missing_are_missing_and_the_others_exist() -> None:
    """celery.md's table of commands says which ``celery`` commands have no ``akadze-compat``
    twin; the CLI agrees both ways (a command that lands must leave the "not provided" row)."""
    from akadze_compat.bin.celery import cli

    text = (GUIDE / "celery.md").read_text()
    missing_rows = [line for line in text.splitlines()
                    if line.startswith("| `celery -A proj") and line.endswith("| not provided |")]
    assert len(missing_rows) == 1, missing_rows
    missing = set(re.findall(r"`(?:celery -A proj )?([a-z]+)`", missing_rows[0]))
    assert missing and not missing & set(cli.commands), missing & set(cli.commands)
    renamed = re.findall(r"\| `celery -A proj ([a-z]+)[^`]*` \| `akadze-compat -A proj \1",
                         text)
    assert renamed and set(renamed) <= set(cli.commands), set(renamed) - set(cli.commands)


#: Integrations, which import their framework (``tests/django6`` resolves their names).
FRAMEWORKS = "akadze_core.contrib."


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: _name(path))
def test_dotted_names_the_guides_give_exist(document: Path) -> None:
    """Every ``akadze_core.…`` / ``akadze_compat.…`` name written in backticks resolves: a
    module that imports, or an attribute of one. Names of ``akadze_core.contrib`` import
    their framework (Django 6, on Python 3.12+): tests/django6 resolves those."""
    import importlib

    unresolved = []
    for dotted in sorted(set(re.findall(r"`(akadze_(?:core|compat)(?:\.\w+)+)`",
                                        document.read_text()))):
        if dotted.startswith(FRAMEWORKS):
            continue
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for name in parts[cut:]:
                found = getattr(found, name, None)
            if found is None:
                unresolved.append(dotted)
            break
    assert not unresolved, unresolved
