"""The code blocks of the README and of docs/ run, or are parsed by the CLI they call.

Every ```python, ```sh or ```sql block of those files is listed in ``COVERED`` with the
test that runs it, and ``test_every_runnable_block_is_covered`` fails on one that is not: a
new block needs a test here (or in test_readme.py), or a fence the tests skip (``text`` for
output, ``ini`` for configuration, ``mermaid`` for diagrams). Blocks are found by file, section
(the nearest ``#``/``##`` heading above them) and their order in it, so a block moved to
another page or section must be moved here too.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import tomllib

from tests.examples.test_readme import PROJECT_ROOT, README, blocks, environment, section

DOCS = PROJECT_ROOT / "docs"
DOCUMENTS = [README, *sorted(DOCS.rglob("*.md"))]
RUNNABLE = {"python", "sh", "sql"}
SKIPPED = {"text", "ini", "mermaid"}
FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,2} (.+)$", re.MULTILINE)

CORE_API = DOCS / "tutorial" / "core-api.md"
WORKFLOWS = DOCS / "tutorial" / "workflows.md"
SCHEDULES = DOCS / "how-to" / "schedules.md"
DASHBOARD = DOCS / "how-to" / "dashboard-and-metrics.md"
SCALING = DOCS / "how-to" / "scaling.md"
PAUSES = DOCS / "how-to" / "pause-queues.md"
CITUS = DOCS / "how-to" / "citus.md"

#: (file, section, language, index in the section) → the test that runs the block.
COVERED = {
    ("README.md", "The two commands", "sh", 0):
        "test_the_two_commands_are_what_the_tests_and_ci_run (the demo: "
        "test_examples.py::test_demo)",
    ("README.md", "The two commands", "sh", 1):
        "test_the_two_commands_are_what_the_tests_and_ci_run (.ci/run runs it)",
    ("README.md", "Quickstart for Celery users", "python", 0):
        "test_readme.py::test_the_celery_quickstart_*",
    ("README.md", "Quickstart for Celery users", "sh", 0):
        "test_readme.py::test_the_celery_quickstart_*",
    ("README.md", "Quickstart for core users", "python", 0):
        "test_readme.py::test_the_core_quickstart_*",
    ("README.md", "Quickstart for core users", "sh", 0):
        "test_readme.py::test_the_core_quickstart_*",
    ("docs/tutorial/core-api.md", "The core API at a glance", "python", 0):
        "test_the_core_api_sketch_runs_as_written",
    ("docs/tutorial/core-api.md", "The core API at a glance", "sh", 0):
        "test_command_lists_parse",
    ("docs/tutorial/workflows.md", "Workflows: chains and fan-out/fan-in", "python", 0):
        "test_the_workflow_example_runs_as_written",
    ("docs/how-to/schedules.md", "Schedules", "python", 0):
        "test_the_schedules_example_declares_its_schedules",
    ("docs/how-to/schedules.md", "Runtime schedules", "python", 0):
        "test_the_runtime_schedules_example_runs_as_written",
    ("docs/how-to/dashboard-and-metrics.md", "Dashboard and metrics", "sh", 0):
        "test_command_lists_parse",
    ("docs/how-to/scaling.md", "The signals", "sql", 0):
        "test_the_scaling_checks_run_and_count_the_prune_backlog",
    ("docs/how-to/pause-queues.md", "From the command line", "sh", 0):
        "test_command_lists_parse (run: test_docs_pauses.py)",
    ("docs/how-to/pause-queues.md", "From Python", "python", 0):
        "test_docs_pauses.py::test_the_python_example_runs_as_written",
    ("docs/how-to/pause-queues.md", "From the Celery facade", "python", 0):
        "test_docs_pauses.py::test_the_celery_example_runs_as_written",
    ("docs/how-to/citus.md", "Turn it on", "sh", 0): "test_command_lists_parse",
    ("docs/how-to/citus.md", "Turn it on", "python", 0):
        "tests/citus/test_docs.py::test_the_citus_example_runs_as_written",
    ("docs/how-to/limits.md", "Rate limits", "python", 0):
        "test_the_rate_limits_example_sets_and_lists_limits",
    ("docs/how-to/limits.md", "Per-key concurrency", "python", 0):
        "test_the_concurrency_example_puts_the_keys_in_the_jobs",
}


def _headings(text: str) -> list[tuple[int, str]]:
    """(offset, title) of the ``#``/``##`` headings of ``text``, not counting the comments
    of its code blocks."""
    fences = [match.span() for match in FENCE.finditer(text)]
    return [(match.start(), match.group(1)) for match in HEADING.finditer(text)
            if not any(start <= match.start() < end for start, end in fences)]


def fenced_blocks(document: Path) -> list[tuple[str, str, int, str]]:
    """(section, language, index in the section, code) of every fenced block of
    ``document``; the section is the nearest ``#`` or ``##`` heading above the block."""
    text = document.read_text("utf-8")
    headings = _headings(text)
    found: list[tuple[str, str, int, str]] = []
    counts: dict[tuple[str, str], int] = {}
    for match in FENCE.finditer(text):
        title = next((heading for start, heading in reversed(headings)
                      if start < match.start()), "")
        language = match.group(1)
        index = counts.get((title, language), 0)
        counts[(title, language)] = index + 1
        found.append((title, language, index, match.group(2)))
    return found


def page_section(document: Path, title: str) -> str:
    """The text of the ``#`` or ``##`` section ``title`` of a docs page, up to the next
    heading of either level."""
    text = document.read_text("utf-8")
    start = re.search(rf"^#{{1,2}} {re.escape(title)}\n", text, re.MULTILINE)
    assert start, f"{document.name} has no section {title!r}"
    following = [at for at, _heading in _headings(text) if at >= start.end()]
    return text[start.end():following[0] if following else len(text)]


def test_every_runnable_block_is_covered() -> None:
    found = set()
    for document in DOCUMENTS:
        name = document.relative_to(PROJECT_ROOT).as_posix()
        for title, language, index, _code in fenced_blocks(document):
            assert language in RUNNABLE | SKIPPED, (
                f"{name}, {title!r}: a block fenced {language!r}; use one of "
                f"{sorted(RUNNABLE | SKIPPED)}")
            if language in RUNNABLE:
                found.add((name, title, language, index))
    assert found - COVERED.keys() == set(), "blocks no test runs (add them to COVERED)"
    assert COVERED.keys() - found == set(), "COVERED names blocks that are gone"


def test_the_two_commands_are_what_the_tests_and_ci_run() -> None:
    """The demo command runs the module test_examples.py::test_demo runs; the test command
    is the one .ci/run finds in the README (its regular expression, read from .ci/run)."""
    demo, tests = blocks(section("The two commands"), "sh")
    assert demo.strip().endswith("python3 -m examples.demo"), demo
    assert "run_example(\"examples.demo\"" in (
        PROJECT_ROOT / "tests" / "examples" / "test_examples.py").read_text()
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    pattern = re.search(r'match = re\.search\(r"(.*?)", text', ci)
    assert pattern, "cannot find how .ci/run reads the test command"
    match = re.search(pattern.group(1), README.read_text("utf-8"), re.MULTILINE | re.DOTALL)
    assert match and match.group(1) == tests


def _commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, leading
    ``NAME=value`` assignments dropped, ``&&`` chains split."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            command, words = words[:cut], words[cut + 1:]
            while command and re.match(r"^[A-Z_]+=", command[0]):
                command = command[1:]
            if command:
                commands.append(command)
    return commands


def _parse(command: click.Command, argv: list[str]) -> None:
    """Parse ``argv`` as ``command`` would, down its subcommands, without running any:
    an unknown command or option, or a bad value, raises click's UsageError."""
    context = command.make_context(command.name, list(argv), resilient_parsing=False)
    while isinstance(command, click.Group):
        protected = context.__dict__.get("_protected_args")
        rest = [*(protected if protected is not None else context.protected_args),
                *context.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(context, rest)
        assert sub is not None and name is not None
        command, context = sub, sub.make_context(name, rest, parent=context)


def _extras() -> set[str]:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


@pytest.mark.parametrize("document", [CORE_API, DASHBOARD, PAUSES, CITUS],
                         ids=lambda path: path.name)
def test_command_lists_parse(document: Path) -> None:
    """Blocks that list commands to pick from (``myproject.tasks:app``, job 42) cannot run
    as a script; each command must still be one the CLI accepts, and a ``pip install`` must
    name extras the project has."""
    from akadze_compat.bin.celery import cli as compat_cli
    from akadze_core.cli.main import cli as core_cli

    clis: dict[str, click.Command] = {"akadze": core_cli, "akadze-compat": compat_cli}
    commands = [command for _title, language, _index, code in fenced_blocks(document)
                if language == "sh" for command in _commands(code)]
    assert commands
    for command in commands:
        if command[:2] == ["pip", "install"]:
            for extra in re.findall(r"\[([\w,]+)\]", " ".join(command[2:])):
                assert set(extra.split(",")) <= _extras(), command
            continue
        assert command[0] in clis, command
        _parse(clis[command[0]], command[1:])


def test_the_core_api_sketch_runs_as_written(tmp_path: Path, database_url: str,
                                            db: psycopg.Connection) -> None:
    """The sketch's Python, top-level await included, against a database with the schema
    and the ``exports`` table its transactional enqueue writes to (the user's own table)."""
    sketch = blocks(page_section(CORE_API, "The core API at a glance"), "python")[0]
    db.execute("CREATE TABLE exports (id text)")
    program = tmp_path / "sketch.py"
    program.write_text(textwrap.dedent(f"""
        import ast, asyncio
        source = {sketch!r}
        code = compile(source, "docs sketch", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        namespace = {{"__name__": "sketch"}}
        async def main():
            result = eval(code, namespace)
            if result is not None:
                await result
            await namespace["app"].close_async()
        asyncio.run(main())
    """))
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path,
                          env=environment(tmp_path, database_url), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert time.monotonic() - started < 60
    rows = db.execute("SELECT task, args, priority, unique_key FROM akadze.jobs "
                      "ORDER BY id").fetchall()
    assert len(rows) == 7, rows  # enqueue, enqueue_async, configure x2, enqueue_many x2, conn
    assert {row[0] for row in rows} == {"export.poll"}
    assert db.execute("SELECT id FROM exports").fetchall() == [("x",)]


async def test_the_workflow_example_runs_as_written(tmp_path: Path, database_url: str,
                                                   db: psycopg.Connection,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflows page's module: enqueued as its ``__main__`` does, drained by a worker,
    the fan-in's result is the words of the three chains added up."""
    import importlib.util

    from tests.integration.outcome_helpers import run_until

    source = blocks(page_section(WORKFLOWS, "Workflows: chains and fan-out/fan-in"),
                    "python")[0]
    assert source.startswith("# pipeline.py:")
    (tmp_path / "pipeline.py").write_text(source)
    monkeypatch.setenv("AKADZE_DATABASE_URL", database_url)
    spec = importlib.util.spec_from_file_location("docs_pipeline", tmp_path / "pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        end_id = module.enqueue()
        counts: dict[str, int] = dict(db.execute(
            "SELECT state, count(*) FROM akadze.jobs GROUP BY state").fetchall())
        assert counts == {"queued": 3, "waiting": 4}
        await run_until(module.app, lambda: db.execute(
            "SELECT state FROM akadze.jobs WHERE id = %s", (end_id,)).fetchone()
            == ("succeeded",))
        assert db.execute("SELECT result FROM akadze.jobs WHERE id = %s", (end_id,)
                          ).fetchone() == ("words: 15",)
    finally:
        await module.app.close_async()


def _run(code: str, namespace: dict[str, Any]) -> None:
    exec(compile(code, "docs block", "exec"), namespace)  # the docs' own code, run as written


def test_the_schedules_example_declares_its_schedules(database_url: str) -> None:
    """The block runs after the core API's ``app`` and ``poll`` exist, as the page reads."""
    from akadze_core import App

    app = App(database_url)
    try:
        @app.task("export.poll")
        async def poll(export_id: str) -> None:
            """The core API page's task."""

        _run(blocks(page_section(SCHEDULES, "Schedules"), "python")[0],
             {"app": app, "poll": poll})
        assert set(app.schedules) == {"reports.nightly", "export.poll", "cleanup"}
    finally:
        app.close()


def test_the_runtime_schedules_example_runs_as_written(database_url: str,
                                                      db: psycopg.Connection) -> None:
    """Add, change, pause, resume, remove: each commits, and the last leaves no row."""
    from akadze_core import App

    app = App(database_url)
    try:
        namespace: dict[str, Any] = {"app": app}
        _run(blocks(page_section(SCHEDULES, "Runtime schedules"), "python")[0], namespace)
        assert namespace["schedules"].get("tenant-42.digest") is None
        assert db.execute("SELECT count(*) FROM akadze.schedules WHERE name = %s",
                          ("tenant-42.digest",)).fetchone() == (0,)
    finally:
        app.close()



def test_the_scaling_checks_run_and_count_the_prune_backlog(db: psycopg.Connection) -> None:
    """Each query of the scaling page's checks runs as written and answers one row; the
    prune backlog counts exactly the finished jobs past the default retentions."""
    db.execute(
        "INSERT INTO akadze.jobs (task, queue, args, state, finished_at) VALUES"
        " ('t', 'q', '{}', 'succeeded', now() - interval '2 days'),"  # past its retention
        " ('t', 'q', '{}', 'cancelled', now() - interval '2 days'),"  # past its retention
        " ('t', 'q', '{}', 'failed', now() - interval '8 days'),"     # past its retention
        " ('t', 'q', '{}', 'failed', now() - interval '2 days'),"     # kept: 7 days
        " ('t', 'q', '{}', 'succeeded', now() - interval '1 hour')")  # kept
    db.execute("INSERT INTO akadze.jobs (task, queue, args) VALUES ('t', 'q', '{}')")
    db.execute("ANALYZE akadze.jobs")
    block, = blocks(page_section(SCALING, "The signals"), "sql")
    statements = [statement for statement in block.split(";") if statement.strip()]
    answers = [db.execute(statement).fetchall() for statement in statements]
    assert [len(rows) for rows in answers] == [1, 1, 1]
    (connections, limit), = answers[0]
    assert 0 < connections <= limit
    assert answers[1] == [(3,)]
    size, _live, _dead = answers[2][0]
    assert size.endswith(("kB", "MB"))
LIMITS = DOCS / "how-to" / "limits.md"


def test_the_rate_limits_example_sets_and_lists_limits(database_url: str) -> None:
    """The limits it sets are in the database, the task's declared one among them once a
    worker would set it, and the last ``None`` removes the queue's."""
    from akadze_core import App

    app = App(database_url)
    try:
        namespace: dict[str, Any] = {"app": app}
        _run(blocks(page_section(LIMITS, "Rate limits"), "python")[0], namespace)
        assert namespace["limits"] == [
            {"kind": "task", "name": "emails.send", "rate": 1000, "period": 3600.0}]
        assert app.declared_rate_limits()[0][1] == "emails.send"
    finally:
        app.close()


def test_the_concurrency_example_puts_the_keys_in_the_jobs(
        database_url: str, db: psycopg.Connection) -> None:
    from akadze_core import App

    app = App(database_url)
    try:
        _run(blocks(page_section(LIMITS, "Per-key concurrency"), "python")[0], {"app": app})
        rows = db.execute("SELECT meta ->> 'concurrency_key', meta ->> 'max_concurrency'"
                          " FROM akadze.jobs ORDER BY id").fetchall()
        assert rows == [("sync", "2"), ("tenant-b", "1")]
    finally:
        app.close()
