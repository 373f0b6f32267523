"""What the migration guide says is or is not supported agrees with
``akadze_compat/support.py`` and with the code.

The signal and task-option tables of celery.md are generated from support.py (between
``<!-- support:NAME -->`` marks; ``python -m akadze_compat.support --write`` rewrites
them); the hand-written statements that remain (the settings that take effect, "what does
not come along", the scheduler and health-file lines) are read from the page and checked
against the tables and, where a table cannot tell, against the code itself.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from akadze_compat import support
from akadze_compat.support import (
    DIFFERENT,
    HONOURED,
    IGNORED,
    MISSING,
    SETTING_SUPPORT,
    SIGNAL_SUPPORT,
    TASK_OPTION_SUPPORT,
    setting_value_support,
)
from tests.examples.test_readme import PROJECT_ROOT

GUIDE = PROJECT_ROOT / "migration_guide"
CELERY = GUIDE / "celery.md"
DJANGO = GUIDE / "django.md"
TICKED = re.compile(r"`([^`]+)`")


def _pages() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


def _section(document: Path, title: str) -> str:
    """The text under the heading ``title`` (any level) up to the next heading of the same
    or a higher level."""
    # Code blocks dropped: their comments would read as headings.
    text = re.sub(r"^```.*?^```", "", document.read_text("utf-8"), flags=re.MULTILINE | re.DOTALL)
    match = re.search(rf"^(#+) {re.escape(title)}\n", text, re.MULTILINE)
    assert match, f"{document.name} has no section {title!r}"
    level = len(match.group(1))
    following = re.search(rf"^#{{1,{level}}} ", text[match.end():], re.MULTILINE)
    return text[match.end():match.end() + following.start() if following else len(text)]


def _row(text: str, starts: str) -> list[str]:
    """The cells of the one table row of ``text`` whose first cell starts with ``starts``."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {starts}")]
    assert len(rows) == 1, (starts, rows)
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


@pytest.mark.parametrize("page", _pages(), ids=lambda path: path.name)
def test_generated_parts_are_what_support_py_says(page: Path) -> None:
    text = page.read_text("utf-8")
    assert support.render_page(text) == text, (
        f"{page.name} is stale: run `python -m akadze_compat.support --write`")


def test_the_generated_parts_are_in_the_guide() -> None:
    """Every part support.py generates is printed somewhere (a mark deleted by hand would
    otherwise leave the check above with nothing to compare)."""
    text = "".join(page.read_text("utf-8") for page in _pages())
    for name, body in support.fragments().items():
        assert f"<!-- support:{name} " in text and body in text, name
    table = support.fragments()["signals"]
    assert set(re.findall(r"^\| `([^`]+)`", table, re.MULTILINE)) == set(SIGNAL_SUPPORT)


def test_the_module_checks_and_rewrites_pages(tmp_path: Path) -> None:
    """``--check`` fails on a page whose generated part was edited, ``--write`` restores it."""
    page = tmp_path / "celery.md"
    page.write_text(CELERY.read_text("utf-8").replace("| `task_prerun` | sent, as in Celery |",
                                                       "| `task_prerun` | never sent |"))
    command = [sys.executable, "-m", "akadze_compat.support"]
    checked = subprocess.run([*command, "--check", str(page)], capture_output=True, text=True,
                             cwd=PROJECT_ROOT)
    assert checked.returncode == 1 and "stale" in checked.stdout, checked
    subprocess.run([*command, "--write", str(page)], check=True, cwd=PROJECT_ROOT)
    assert page.read_text("utf-8") == CELERY.read_text("utf-8")


def test_the_settings_the_guide_says_take_effect_do() -> None:
    """celery.md's table of the settings that take effect names only honoured or different
    ones (test_doctor.py checks each of those is read by the code)."""
    table = _section(CELERY, "4. Settings").split("Everything else")[0]
    named = [name for line in table.splitlines() if line.startswith("| `")
             for name in TICKED.findall(line.split(" | ")[0])]
    settings = [name for name in named if name in SETTING_SUPPORT]
    assert len(settings) >= 25, settings
    wrong = {name: SETTING_SUPPORT[name].status for name in settings
             if SETTING_SUPPORT[name].status not in (HONOURED, DIFFERENT)}
    assert not wrong, wrong


def test_what_the_guide_says_changes_nothing_is_ignored() -> None:
    """The at-least-once paragraph: the options and settings it says change nothing are
    ignored; ``task_acks_late``, which it says decides the prefetch window, is not."""
    text = " ".join(_section(CELERY, "Delivery is always at least once").split())
    nothing = text.split(" change nothing")[0].rsplit("So ", 1)[1]
    names = TICKED.findall(nothing)
    assert names == ["acks_late", "task_reject_on_worker_lost",
                     "worker_deduplicate_successful_tasks"]
    for name in names:
        entry = TASK_OPTION_SUPPORT.get(name) or SETTING_SUPPORT[name]
        assert entry.status == IGNORED, (name, entry)
    assert "`task_acks_late` only decides" in text
    assert SETTING_SUPPORT["task_acks_late"].status == DIFFERENT
    assert "prefetch" in SETTING_SUPPORT["task_acks_late"].note


def test_what_does_not_come_along() -> None:
    """Each row of celery.md's section 0, against the tables and the code."""
    from akadze_compat.app.control import Control
    from akadze_compat.bin.celery import cli

    text = _section(CELERY, "0. What does not come along")
    # Rate limits come along, global rather than per worker (section 6, Rate limits).
    assert "`rate_limit`" not in text
    assert TASK_OPTION_SUPPORT["rate_limit"].status == DIFFERENT
    assert "task_annotations are applied" in TASK_OPTION_SUPPORT["rate_limit"].note
    assert SETTING_SUPPORT["task_annotations"].status == HONOURED
    assert SETTING_SUPPORT["task_default_rate_limit"].status == DIFFERENT

    assert _row(text, "pickle, yaml, msgpack")[1].startswith("refused")
    for value in ("pickle", "yaml", "msgpack"):
        assert setting_value_support("task_serializer", value).status == MISSING  # type: ignore[union-attr]

    assert "threads pool runs instead" in _row(text, "eventlet / gevent")[1]
    for pool in ("eventlet", "gevent"):
        entry = setting_value_support("worker_pool", pool)
        assert entry is not None and entry.status == DIFFERENT and "threads" in entry.note

    redbeat = _row(text, "schedules kept by another `beat_scheduler`")[1]
    assert redbeat.startswith("do not run") and "`DatabaseScheduler` **does** run" in redbeat
    entry = setting_value_support("beat_scheduler", "redbeat.RedBeatScheduler")
    assert entry is not None and entry.status == MISSING
    entry = setting_value_support("beat_scheduler",
                                  "django_celery_beat.schedulers:DatabaseScheduler")
    assert entry is not None and entry.status == DIFFERENT and "runs" in entry.note

    assert "not provided" in _row(text, "`celery events`")[1] and "events" not in cli.commands
    assert "`akadze-compat -A proj flower`" in _row(text, "Flower")[1]
    assert "flower" in cli.commands

    control = _row(text, "`app.control.autoscale`")
    assert control[1].startswith("missing")
    names = [name for part in TICKED.findall(control[0]) for name in part.split("/")]
    names = [name.removeprefix("app.control.") for name in names]
    assert len(names) == 4 and not [name for name in names if hasattr(Control, name)]
    assert hasattr(Control, "enable_events") and hasattr(Control, "disable_events")
    for name in ("revoke", "inspect", "ping", "broadcast", "purge", "shutdown"):
        assert hasattr(Control, name), name


@pytest.mark.parametrize("path", [
    "akadze_compat.beat:PersistentScheduler", "akadze_compat.contrib.rdb",
    "akadze_compat.contrib.migrate"])
def test_the_paths_the_guide_says_fail_at_import_do(path: str) -> None:
    """Section 0: custom beat schedulers and bootsteps fail with an
    ImportError naming the section to read; rdb and migrate do not exist."""
    text = _section(CELERY, "0. What does not come along")
    module, _, name = path.partition(":")
    assert module.rsplit(".", 1)[1] in text and (not name or name in text), path
    with pytest.raises(ImportError) as raised:
        imported = importlib.import_module(module)
        if name:
            getattr(imported, name)
    if name:
        assert "migration_guide/celery.md#" in str(raised.value)


def test_the_health_file_lines() -> None:
    """celery.md: ``akadze-compat worker`` has no --health-file, ``akadze worker`` has one."""
    from akadze_compat.bin.celery import cli as compat_cli
    from akadze_core.cli.main import cli as core_cli

    text = " ".join(_section(CELERY, "5. Run it").split())
    assert ("`akadze-compat worker` has no `--health-file` (not yet supported); "
            "`akadze worker --health-file PATH` (the core worker) has one") in text
    compat = {option for param in compat_cli.commands["worker"].params
              for option in getattr(param, "opts", [])}
    core = {option for param in core_cli.commands["worker"].params  # type: ignore[attr-defined]
            for option in getattr(param, "opts", [])}
    assert "--health-file" not in compat and "--health-file" in core


def test_the_redbeat_line_the_guide_quotes_is_the_one_the_worker_logs() -> None:
    from akadze_compat._schedulers import unhonoured_scheduler

    text = " ".join(_section(CELERY, "Beat runs inside the workers").split())
    quoted = re.search(r"e\.g\. `(beat_scheduler redbeat[^`]+)`", text)
    assert quoted
    logged = unhonoured_scheduler("redbeat.RedBeatScheduler")
    assert logged is not None and logged.startswith(quoted.group(1))


def test_django_add_on_lines() -> None:
    """django.md: results need no django_celery_results (result_backend is ignored), and
    django_celery_beat's DatabaseScheduler runs."""
    text = " ".join(_section(DJANGO, "The app module and the settings").split())
    assert "`django_celery_results` is not needed" in text
    assert SETTING_SUPPORT["result_backend"].status == IGNORED
    assert "`django_celery_beat`'s `DatabaseScheduler` runs" in text
    entry = setting_value_support("beat_scheduler",
                                  "django_celery_beat.schedulers:DatabaseScheduler")
    assert entry is not None and entry.status == DIFFERENT


def test_the_flower_options_the_guide_lists() -> None:
    """django.md's Flower paragraph: the options it names are read as it says, OAuth and
    TLS stop the command, other options are ignored with a warning."""
    from akadze_compat.bin.base import CliError
    from akadze_compat.bin.celery import cli
    from akadze_compat.bin.flower import read_flower_options

    text = " ".join(_section(DJANGO, "The dashboard (instead of Flower)").split())
    flower = cli.commands["flower"]
    defaults = {param.name: param.default for param in flower.params}
    assert "`--port` (5555)" in text and defaults["port"] == 5555
    assert "`--address` (127.0.0.1)" in text and defaults["address"] == "127.0.0.1"
    options = {option for param in flower.params for option in getattr(param, "opts", [])}
    for named in ("--port", "--address", "--basic-auth", "--url-prefix", "--read-only",
                  "--token", "--unauthenticated"):
        assert f"`{named}" in text and named in options, named
    read = read_flower_options(["--basic_auth=a:b,c:d"], environ={}, cwd=Path("/nonexistent"))
    assert read.basic_auth == "a:b,c:d"
    read = read_flower_options([], environ={"FLOWER_BASIC_AUTH": "a:b", "FLOWER_PORT": "6000"},
                               cwd=Path("/nonexistent"))
    assert read.basic_auth == "a:b" and read.port == 6000
    assert "(`--auth`, `--auth_provider`) and TLS (`--certfile`) options stop it" in text
    for refused in ("--auth=.*@example.com", "--auth_provider=x", "--certfile=/c.pem"):
        with pytest.raises(CliError):
            read_flower_options([refused], environ={}, cwd=Path("/nonexistent"))
    assert "Flower's other options are ignored with a warning" in text
    assert read_flower_options(["--max_tasks=100"], environ={},
                               cwd=Path("/nonexistent")).ignored


def test_the_akadze_metrics_the_guide_maps_flower_to_exist() -> None:
    """metrics.md's Flower -> akadze table names only series the code exports."""
    sources = "".join(path.read_text("utf-8") for package in ("akadze_core", "akadze_compat")
                      for path in (PROJECT_ROOT / package).rglob("*.py"))
    table = (GUIDE / "metrics.md").read_text("utf-8").split("| Flower | akadze | note |")[1]
    named = set(re.findall(r"`(akadze_[a-z_]+)", table))
    assert len(named) >= 8, named
    exported = {name for name in named
                # a counter is declared without the _total its samples get
                if re.search(rf"[\"']{re.sub(r'_(count|total)$', '', name)}[\"']", sources)}
    assert named == exported, named - exported


def test_the_worker_options_the_guide_calls_accepted_are() -> None:
    """celery.md: ``-B`` is accepted, and the options with no meaning here are parsed (and
    warned about), not refused."""
    from akadze_compat.bin.celery import cli
    from tests.examples.test_docs import _parse

    text = " ".join(_section(CELERY, "5. Run it").split())
    listed = re.search(r"Options that have no meaning here \(([^)]*)\.\.\.\)", text)
    assert listed
    flags = TICKED.findall(listed.group(1))
    assert len(flags) >= 5, flags
    values = {"--autoscale": ["10,3"]}  # Celery's max,min
    for flag in [*flags, "-B"]:
        _parse(cli, ["-A", "proj", "worker", flag, *values.get(flag, [])])


def test_the_pytest_fixtures_the_guide_names_exist() -> None:
    """celery.md's "Testing your tasks": each fixture and helper it names is in the plugin."""
    import akadze_compat.contrib.pytest as plugin
    from akadze_compat.contrib.testing.worker import start_worker

    text = _section(CELERY, "Testing your tasks").split("What differs")[0]
    names = [name for name in TICKED.findall(text)
             if re.fullmatch(r"(celery|use|depends)_\w+", name)]
    assert len(names) >= 13, names
    missing = [name for name in names if not callable(getattr(plugin, name, None))]
    assert not missing, missing
    assert "@pytest.mark.celery(**settings)" in text and callable(start_worker)
