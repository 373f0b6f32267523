"""``akadze-compat -A proj doctor [--json]``: a migration report for a Celery project.

It loads the project as the worker does (the app, its configuration, ``imports``/``include``
and autodiscovery; never the database, so it runs where no database is reachable), lists the
tasks with the queue routing gives each, and reports every setting, task option, periodic
task, signal receiver and API the project uses that akadze ignores, changes or lacks (see
``doctor`` and ``doctor_scan``; the statuses come from ``support``).

Exit code 0 when nothing blocks, 1 when the project uses something akadze lacks (a
``missing`` finding), so CI can gate on it; expected errors are one line, as in every
command.
"""

from __future__ import annotations

import json
import os
import textwrap
import traceback
from typing import Any

import click

from ..addons import alias_state, installed_addons
from ..doctor import KINDS, Report, build_report
from .base import CliError, cli_state, secrets

__all__ = ["doctor_command"]

_SECTIONS = (("settings", "Settings"), ("periodic tasks", "Periodic tasks (beat_schedule)"),
             ("task options", "Task options"), ("signals", "Signal receivers"),
             ("api", "APIs used in the source"))
_WIDTH = 100
_RENAME_HINT = ("the project still imports celery: replace `celery` with `akadze_compat` in "
                "its imports first (migration_guide/celery.md)")


def _load(ctx: click.Context) -> Any:
    """The app of ``-A``, with its task modules imported and its tasks created: what
    ``Celery.prepare_worker`` does before it needs the database."""

    state = cli_state(ctx)
    try:
        app = state.load_app()
    except CliError as exc:
        if "No module named 'celery'" in exc.message:
            raise CliError(f"{exc.message}: {_RENAME_HINT}") from None
        raise
    app.set_current()
    try:
        app.loader.import_default_modules()
        app.finalize()
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "celery":
            raise CliError(_RENAME_HINT) from None
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise CliError(f"loading the project's task modules failed: {type(exc).__name__}: "
                       f"{exc}{where}") from None
    return app


def _wrap(text: str, indent: int) -> str:
    return textwrap.fill(text, _WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * indent, break_on_hyphens=False,
                         break_long_words=False)


def render_addons(state: dict[str, Any], addons: list[dict[str, Any]]) -> list[str]:
    """The lines on the celery alias and the Celery add-ons installed."""
    if state["on"]:
        switch = "on: `import celery` resolves to akadze_compat"
    else:
        switch = "off: `import celery` imports " + (
            f"the real celery {state['real_celery']}" if state["real_celery"]
            else "nothing (no celery is installed)")
    lines = ["", "Celery add-ons", f"  celery alias: {switch} (AKADZE_CELERY="
             f"{state['env'] if state['env'] is not None else '(unset)'})"]
    if state["on"] and state["real_celery"]:
        lines.append(f"  celery {state['real_celery']} is installed (a dependency of the "
                     "add-ons): not used while the alias is on")
    for addon in addons:
        lines.append(f"  {addon['distribution']} {addon['version']}: see {addon['guide']}")
    if not addons:
        lines.append("  none of the add-ons migration_guide/third-party.md covers is installed")
    return lines


def render_text(report: Report, addon_lines: list[str] | None = None) -> str:
    """The report as the doctor prints it (``addon_lines`` go before the summary)."""
    counts = report.counts()
    config = f"config {report.config}; " if report.config else ""
    lines = [f"akadze-compat doctor: app {report.app} ({config}{len(report.tasks)} tasks; "
             f"{report.files_scanned} source files scanned)", "", "Tasks"]
    width = max((len(task.name) for task in report.tasks), default=0)
    for task in report.tasks:
        options = " ".join(f"{key}={value}" for key, value in task.options.items())
        kind = "async " if task.is_async else ""
        lines.append(f"  {task.name:<{width}}  {kind}queue {task.queue}"
                     f"{'  ' + options if options else ''}".rstrip())
    if not report.tasks:
        lines.append("  (none registered)")
    for section, title in _SECTIONS:
        findings = [item for item in report.findings if item.section == section]
        if not findings:
            continue
        lines += ["", title]
        for item in findings:
            setting = f" ({item.key})" if section == "settings" and item.key != item.subject \
                and item.kind != "unknown" else ""
            value = f" = {item.value}" if item.value is not None else ""
            lines.append(f"  [{item.kind}] {item.subject}{setting}{value}")
            lines.extend(_wrap(where, 6) for where in item.where)
            lines.append(_wrap(item.message, 6))
    if report.unparsed:
        lines += ["", "Not scanned (does not parse): " + ", ".join(report.unparsed)]
    lines += addon_lines or []
    summary = ", ".join(f"{counts[kind]} {kind}" for kind in KINDS)
    verdict = ("something the project uses is missing in akadze" if report.exit_code
               else "nothing blocks the move")
    lines += ["", f"Summary: {summary}: {verdict} (exit {report.exit_code})"]
    return "\n".join(lines)


@click.command("doctor")
@click.option("-j", "--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def doctor_command(ctx: click.Context, as_json: bool) -> None:
    """Report what the project uses that akadze ignores, changes or lacks.

    Loads the project like the worker does, without connecting to the database, and lists
    its tasks, then its settings, task options, periodic tasks, signal receivers and Celery
    APIs (a scan of its source) that need attention. Exits 1 when something it uses is
    missing in akadze, 0 otherwise.
    """

    for name, value in os.environ.items():
        if "URL" in name or "DSN" in name:
            secrets.add_url(value)
    app = _load(ctx)
    report = build_report(app, cli_state(ctx).app_spec)
    for value in app.conf.without_defaults().values():
        secrets.add_url(value if isinstance(value, str) and "://" in value else None)
    state, addons = alias_state(), installed_addons()
    if as_json:
        data = {**report.as_dict(), "celery_alias": state, "addons": addons}
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    else:
        text = render_text(report, render_addons(state, addons))
    click.echo(secrets.scrub(text))
    ctx.exit(report.exit_code)
