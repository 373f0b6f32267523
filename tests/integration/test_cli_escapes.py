"""Names and texts from rows never send control sequences to the terminal.

Task names, queue names, schedule names, error messages and results are row data: anyone
who can enqueue can choose them. Printed verbatim, ``ESC ] 0 ; ... BEL`` retitles the
terminal window and ``ESC ] 52 ; c ; ... BEL`` writes the clipboard (OSC 52). Every CLI
output that prints row data shows them escaped instead (``\\x1b``), and ``--json`` output
stays valid JSON holding the exact names.
"""

from __future__ import annotations

import json

import psycopg
from click.testing import CliRunner, Result

from akadze_compat.bin.celery import cli as compat_cli
from akadze_core import App, Every
from akadze_core.cli.main import cli
from akadze_core.cli.support import printable

TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
C1_CSI = "\x9b2J"  # one-byte CSI: "clear the screen" on terminals that read C1
TASK = f"mail.send{TITLE}"
QUEUE = f"mail{CLIPBOARD}"
CONTROLS = ("\x1b", "\x07", "\x9b", "\r")


def run(*args: str, url: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"AKADZE_DATABASE_URL": url})


def assert_clean(text: str) -> None:
    """No control character but newlines reaches the terminal."""
    for char in CONTROLS:
        assert char not in text, repr(text)


def test_printable_escapes_controls_as_python_does() -> None:
    assert printable(TITLE) == "\\x1b]0;pwned\\x07"
    assert printable("a\nb\r\x9b\x7f") == "a\\nb\\r\\x9b\\x7f"
    assert printable("a\nb\x1b", lines=True) == "a\nb\\x1b"
    assert printable("plain caf\u00e9 \u65e5\u672c") == "plain caf\u00e9 \u65e5\u672c"
    text = json.dumps({"t": TASK + C1_CSI + "\x7f"}, ensure_ascii=False)
    assert json.loads(printable(text, json_text=True)) == json.loads(text)
    assert_clean(printable(text, json_text=True))


def test_jobs_list_show_stats_and_schedules_escape_names_from_rows(
        database_url: str, db: psycopg.Connection) -> None:
    app = App(database_url)
    try:
        @app.task(TASK, queue=QUEUE)
        def send(**_: object) -> None:
            """Never runs here."""

        job_id = int(send.enqueue(to=f"ada{C1_CSI}"))
        app.runtime_schedules.add(f"nightly{TITLE}", TASK, trigger=Every(3600), queue=QUEUE)
    finally:
        app.close()
    db.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now(), errors = "
               "jsonb_build_array(jsonb_build_object('attempt', 1, 'type', %s::text, "
               "'message', %s::text, 'traceback', %s::text)) WHERE id = %s",
               [f"Boom{TITLE}", f"bad {CLIPBOARD}\rfake line", f"Traceback\n  {TITLE}\n",
                job_id])

    listed = run("jobs", "list", url=database_url)
    assert listed.exit_code == 0, listed.output
    assert_clean(listed.output)
    assert "mail.send\\x1b]0;pwned\\x07" in listed.output
    assert "mail\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in listed.output

    shown = run("jobs", "show", str(job_id), url=database_url)
    assert shown.exit_code == 0, shown.output
    assert_clean(shown.output)
    assert "Boom\\x1b]0;pwned\\x07: bad \\x1b]52;c;ZWNobyBwd25lZA==\\x07\\rfake line" \
        in shown.output
    assert "ada\\x9b2J" in shown.output and "    Traceback\n      \\x1b]0;pwned" in shown.output

    for args in (["jobs", "list", "--json"], ["jobs", "show", str(job_id), "--json"],
                 ["stats", "--json"], ["schedules", "list", "--json"]):
        dumped = run(*args, url=database_url)
        assert dumped.exit_code == 0, dumped.output
        assert_clean(dumped.output)
        # JSON's own escape: a JSON reader gets the exact name back.
        assert "mail\\u001b]52;c;" in dumped.output or "mail.send\\u001b]0;" in dumped.output
    data = json.loads(run("jobs", "show", str(job_id), "--json", url=database_url).output)
    assert (data["task"], data["queue"], data["args"]) == (TASK, QUEUE, {"to": f"ada{C1_CSI}"})

    for args in (["stats"], ["schedules", "list"]):
        table = run(*args, url=database_url)
        assert table.exit_code == 0, table.output
        assert_clean(table.output)
        assert "mail\\x1b]52;c;" in table.output

    # An error line quoting a name the user typed is escaped too.
    missing = run("schedules", "pause", f"x{TITLE}", url=database_url)
    assert missing.exit_code == 1 and "x\\x1b]0;pwned\\x07" in missing.output
    assert_clean(missing.output)


def test_compat_result_and_purge_escape_row_data(database_url: str,
                                                 db: psycopg.Connection) -> None:
    from akadze_compat import Celery

    app = Celery("proj", broker=database_url, set_as_current=False)
    try:
        sent = app.send_task("t.echo", args=[1], queue=QUEUE)
    finally:
        if app._core is not None:
            app._core.close()
        app.close()
    db.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now(), "
               "result = to_jsonb(%s::text) WHERE id = %s",
               [f"done{TITLE}\nsecond line", sent.job_id])
    env = {"AKADZE_DATABASE_URL": database_url, "CELERY_BROKER_URL": database_url}
    shown = CliRunner().invoke(compat_cli, ["result", sent.id, "--timeout", "5"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.output == "done\\x1b]0;pwned\\x07\nsecond line\n"

    db.execute("UPDATE akadze.jobs SET state = 'queued', finished_at = NULL, result = NULL")
    purged = CliRunner().invoke(compat_cli, ["purge", "-f"], env=env)
    assert purged.exit_code == 0, purged.output
    assert_clean(purged.output)
