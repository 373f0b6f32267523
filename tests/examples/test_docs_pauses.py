"""The blocks of docs/how-to/pause-queues.md run as written, and its commands print what
the page says."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from click.testing import CliRunner

from akadze_compat import Celery
from akadze_core import App
from akadze_core.cli.main import cli
from tests.examples.test_docs import PAUSES, _commands, _run, fenced_blocks, page_section
from tests.examples.test_readme import blocks


def test_the_python_example_runs_as_written(database_url: str, db: psycopg.Connection,
                                            capsys: Any) -> None:
    app = App(database_url)
    try:
        @app.task("email.send", queue="emails")
        async def send_email(to: str) -> None:
            """The page's task."""

        _run(blocks(page_section(PAUSES, "From Python"), "python")[0],
             {"app": app, "send_email": send_email})
        assert app.paused_queues() == []
        assert capsys.readouterr().out == "emails active 1 0\n"
    finally:
        app.close()


def test_the_celery_example_runs_as_written(database_url: str) -> None:
    app = Celery("proj", broker=database_url, set_as_current=False)
    try:
        _run(blocks(page_section(PAUSES, "From the Celery facade"), "python")[0],
             {"app": app})
        assert app.control.paused_queues() == []
        app.control.pause_queue("other")
        assert app.core.paused_queues() == ["other"]
    finally:
        app.core.close()


def test_the_commands_print_what_the_page_says(database_url: str) -> None:
    [block] = [code for title, language, _index, code in fenced_blocks(PAUSES)
               if language == "sh" and title == "From the command line"]
    outputs = []
    for command in _commands(block):
        assert command[0] == "akadze"
        result = CliRunner().invoke(cli, command[1:], env={"AKADZE_DATABASE_URL": database_url})
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    assert outputs[0] == "no queues\n"
    assert outputs[1] == "paused queue emails\n"
    assert outputs[2] == "queue emails was already paused\n"
    [listed] = json.loads(outputs[3])
    assert (listed["queue"], listed["paused"], listed["paused_by"]) == ("emails", True, "ops")
    assert outputs[4] == "resumed queue emails\n"
