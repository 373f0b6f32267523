"""Every code block of the migration guide runs.

Each ```python, ```sh and ```console block of every ``migration_guide/*.md`` page (a new
page is picked up by itself) is listed in ``COVERED`` with the test that runs it, and
``test_every_runnable_block_of_the_guide_is_covered`` fails on one that is not: a new block
needs a test here, or a fence the tests skip (``text`` for output and DSNs, ``ini``,
``yaml`` and ``dockerfile`` for configuration, ``mermaid`` for diagrams). Blocks are found
by page, section (the nearest ``#``/``##`` heading above them) and order in it, as in
test_docs.py.

The blocks run as a user would run them: written to files of a small project in a new
directory (``proj``, the name the guide uses), their commands run by bash with the project's
console scripts on PATH, against a fresh Postgres database. Blocks that show the Celery
code a user has before the move run under real Celery 5.7 (``$CELERY_PYTHON``; those tests
skip when it is absent), with Redis and RabbitMQ on localhost.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.compat import differential
from tests.examples.test_docs import _commands, _headings, _parse
from tests.examples.test_readme import (
    PROJECT_ROOT,
    READY,
    _wait_for_group_exit,
    _wait_for_line,
    environment,
)

pytestmark = pytest.mark.slow

GUIDE = PROJECT_ROOT / "migration_guide"
RUNNABLE = {"python", "sh", "console"}
SKIPPED = {"text", "ini", "yaml", "dockerfile", "mermaid"}

#: django.md's section on Django 6's own task framework: a project of its own, run by Django
#: 6 in ``$DJANGO6_PYTHON`` (``test_the_django_tasks_section``), not the Celery project.
DJANGO_TASKS = "Django's own task framework (`django.tasks`, Django 6)"

#: (page, section, language, index in the section) -> the test that runs the block.
COVERED = {
    ("third-party.md", "The switch: `celery` resolves to akadze_compat", "sh", 0):
        "test_the_third_party_page_blocks_run",
    ("third-party.md", "The switch: `celery` resolves to akadze_compat", "python", 0):
        "test_the_third_party_page_blocks_run",
    ("third-party.md", "Boot steps and task annotations", "python", 0):
        "test_the_third_party_page_blocks_run",
    ("README.md", "Regenerating the tables", "sh", 0):
        "test_the_tables_regenerate_as_committed",
    ("celery.md", "1. Install, and create the schema", "sh", 0):
        "test_migrate_commands_create_the_schema",
    ("celery.md", "2. Point `broker_url` at Postgres", "python", 0):
        "test_the_broker_url_module",
    ("celery.md", "3. Rename the imports", "sh", 0): "test_the_rename_and_the_review_greps",
    ("celery.md", "3. Rename the imports", "sh", 1): "test_the_rename_and_the_review_greps",
    ("celery.md", "3. Rename the imports", "sh", 2): "test_the_rename_and_the_review_greps",
    ("celery.md", "5. Run it", "sh", 0): "test_the_worker_commands_run_tasks",
    ("celery.md", "Testing your tasks", "python", 0): "test_the_pytest_plugin_line",
    ("celery.md", "6. Behaviour differences", "python", 0):
        "test_the_transactional_enqueue_block",
    ("celery.md", "7. Switch over without losing a task", "sh", 0):
        "test_the_drain_commands_on_celery",
    ("celery.md", "7. Switch over without losing a task", "python", 0):
        "test_side_by_side_blocks_in_one_virtualenv",
    ("celery.md", "8. Running both side by side", "python", 0):
        "test_side_by_side_blocks_in_one_virtualenv",
    ("arq.md", "Side by side", "python", 0): "test_the_arq_service_before_the_move",
    ("arq.md", "Side by side", "python", 1): "test_the_arq_service_before_the_move",
    ("arq.md", "Side by side", "python", 2): "test_the_arq_service_after_the_move",
    ("arq.md", "Side by side", "python", 3): "test_the_arq_service_after_the_move",
    ("arq.md", "Side by side", "python", 4): "test_the_arq_service_after_the_move",
    **{("django.md", title, language, index): "test_the_django_project_of_the_guide"
       for title, language, index in (
           ("The app module and the settings", "python", 0),
           ("The app module and the settings", "python", 1),
           ("The app module and the settings", "python", 2),
           ("Enqueueing inside `transaction.atomic()`", "python", 0),
           ("Testing", "python", 0), ("Testing", "python", 1), ("Testing", "python", 2),
           ("Testing", "sh", 0), ("The dashboard (instead of Flower)", "python", 0))},
    **{("django.md", DJANGO_TASKS, language, index): "test_the_django_tasks_section"
       for language, index in (("python", 0), ("python", 1), ("python", 2), ("sh", 0))},
    ("arq.md", "The dead-letter queue is the `failed` state", "sh", 0):
        "test_command_lists_parse",
    ("deployment.md", "Containers (Docker, Podman, Compose)", "sh", 0):
        "test_command_lists_parse",
}


#: A fenced block, also one indented under a list item (its code is dedented).
FENCE = re.compile(r"^([ \t]*)```(\S*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def _pages() -> list[Path]:
    return sorted(GUIDE.glob("*.md"))


def fenced_blocks(document: Path) -> list[tuple[str, str, int, str]]:
    """(section, language, index in the section, code) of every fenced block of
    ``document``, as test_docs.py finds them, indented blocks included."""
    text = document.read_text("utf-8")
    headings = _headings(text)
    found: list[tuple[str, str, int, str]] = []
    counts: dict[tuple[str, str], int] = {}
    for match in FENCE.finditer(text):
        title = next((heading for start, heading in reversed(headings)
                      if start < match.start()), "")
        language = match.group(2)
        index = counts.get((title, language), 0)
        counts[(title, language)] = index + 1
        found.append((title, language, index, textwrap.dedent(match.group(3))))
    return found


def guide_block(page: str, title: str, language: str, index: int = 0) -> str:
    """The code of one block of a guide page, as ``COVERED`` names it."""
    found = [code for section, lang, number, code in fenced_blocks(GUIDE / page)
             if (section, lang, number) == (title, language, index)]
    assert len(found) == 1, (page, title, language, index)
    return found[0]


def test_every_runnable_block_of_the_guide_is_covered() -> None:
    found = set()
    for page in _pages():
        for title, language, index, _code in fenced_blocks(page):
            assert language in RUNNABLE | SKIPPED, (
                f"{page.name}, {title!r}: a block fenced {language!r}; use one of "
                f"{sorted(RUNNABLE | SKIPPED)}")
            if language in RUNNABLE:
                found.add((page.name, title, language, index))
    assert found - COVERED.keys() == set(), "blocks no test runs (add them to COVERED)"
    assert COVERED.keys() - found == set(), "COVERED names blocks that are gone"
    tests = {name.split(" ")[0] for name in COVERED.values()}
    assert tests <= set(globals()), tests - set(globals())


# --- helpers -------------------------------------------------------------------------------

PROJ_CELERY = '''\
from akadze_compat import Celery

app = Celery("proj", include=["proj.tasks"])
'''
PROJ_TASKS = '''\
from proj.celery import app


@app.task
def add(x, y):
    return x + y


@app.task
def send_receipt(order_id):
    return order_id
'''


def write_files(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def proj(directory: Path, **files: str) -> Path:
    """A small akadze_compat project ``proj`` (tasks ``add`` and ``send_receipt``) in
    ``directory``; ``files`` adds or replaces modules of it (``celery_legacy="..."``)."""
    write_files(directory, {"proj/__init__.py": "", "proj/celery.py": PROJ_CELERY,
                            "proj/tasks.py": PROJ_TASKS,
                            **{f"proj/{name}.py": text for name, text in files.items()}})
    return directory


def bash(code: str, cwd: Path, env: dict[str, str], *, strict: bool = True,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a block with bash; ``strict``: every command must succeed."""
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code] if strict
                          else ["bash", "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if strict:
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


def python(code: str, cwd: Path, env: dict[str, str], interpreter: str = sys.executable,
           timeout: float = 120) -> str:
    done = subprocess.run([interpreter, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def celery_python() -> str:
    """Celery 5.7's interpreter, or skip."""
    interpreter = differential.celery_python()
    if not Path(interpreter).is_file():
        pytest.skip(differential.no_celery_reason(interpreter))
    return interpreter


def user_env(directory: Path, database_url: str | None) -> dict[str, str]:
    """test_readme's newcomer environment, with ``python`` on PATH too."""
    env = environment(directory, database_url)
    shim = directory / "bin" / "python"
    if not shim.exists():
        shim.write_text(f"#!/bin/sh\nexec '{sys.executable}' \"$@\"\n")
        shim.chmod(0o755)
    return env


# --- README.md ------------------------------------------------------------------------------

def test_the_tables_regenerate_as_committed(tmp_path: Path) -> None:
    """The block, run in a copy of the guide: the first command rewrites the two tables,
    the second finds them current, and they are the committed pages."""
    interpreter = celery_python()
    shutil.copytree(GUIDE, tmp_path / "migration_guide")
    (tmp_path / "akadze_compat").symlink_to(PROJECT_ROOT / "akadze_compat")  # it reads the code
    env = {**user_env(tmp_path, None), "CELERY_PYTHON": interpreter}
    bash(guide_block("README.md", "Regenerating the tables", "sh"), tmp_path, env,
         timeout=600)
    for name in ("celery-settings.md", "celery-api.md"):
        assert (tmp_path / "migration_guide" / name).read_text() == (GUIDE / name).read_text()


# --- celery.md ------------------------------------------------------------------------------

def test_migrate_commands_create_the_schema(tmp_path: Path, empty_database_url: str) -> None:
    proj(tmp_path)
    bash(guide_block("celery.md", "1. Install, and create the schema", "sh"), tmp_path,
         user_env(tmp_path, empty_database_url))
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('akadze.jobs')").fetchone() == ("akadze.jobs",)


def test_the_broker_url_module(tmp_path: Path) -> None:
    """The module imports (the app connects to nothing until it is used) and its broker
    is the Postgres URL, not Celery's default AMQP one."""
    module = guide_block("celery.md", "2. Point `broker_url` at Postgres", "python")
    assert module.startswith("# proj/celery.py\n")
    write_files(tmp_path, {"proj/__init__.py": "", "proj/celery.py": module})
    printed = python("from proj.celery import app; print(app.conf.broker_url)", tmp_path,
                     user_env(tmp_path, None))
    assert printed.strip() == "postgresql://app:secret@db:5432/app"


CELERY_PROJECT = {
    "proj/__init__.py": "from .celery import app as celery_app\n\n__all__ = ('celery_app',)\n",
    "proj/celery.py": '''\
        from celery import Celery

        app = Celery("proj")
        app.config_from_object("proj.celeryconfig")
        app.autodiscover_tasks(["proj"])
        ''',
    "proj/celeryconfig.py": '''\
        broker_url = "redis://127.0.0.1:6379/0"
        beat_scheduler = "celery.beat:PersistentScheduler"
        ''',
    "proj/tasks.py": '''\
        import celery
        import celery.exceptions
        from celery import shared_task
        from celery.contrib.abortable import AbortableTask
        from proj.celery import app

        celery_helpers = "celery"  # from celery import nothing: a string


        @shared_task(bind=True, base=AbortableTask)
        def add(self, x, y):
            if x < 0:
                raise celery.exceptions.Reject("negative")
            return celery.current_app.main and x + y


        def handler():
            from celery.result import AsyncResult
            return AsyncResult
        ''',
    "Procfile": "worker: celery -A proj worker -l INFO -c 8\nbeat: celery -A proj beat\n",
}


def test_the_rename_and_the_review_greps(tmp_path: Path) -> None:
    """In a git repository holding a Celery project: the sed rewrites the imports at the
    start of a line and nothing else, the review greps show what the guide says they show,
    and once the one line the guide says to fix by hand is fixed the project imports on
    akadze_compat (with Celery 5.7 at hand, it imports there before the rename too)."""
    write_files(tmp_path, CELERY_PROJECT)
    env = user_env(tmp_path, None)
    git = ["git", "-c", "user.name=guide", "-c", "user.email=guide@example.invalid"]
    for command in (["git", "init", "-q"], ["git", "add", "."], [*git, "commit", "-qm", "old"]):
        subprocess.run(command, cwd=tmp_path, check=True, env=env)
    if Path(differential.celery_python()).is_file():
        python("import proj.tasks", tmp_path, env, interpreter=differential.celery_python())

    rename, review, commands = (guide_block("celery.md", "3. Rename the imports", "sh", index)
                                for index in range(3))
    bash(rename, tmp_path, env)
    tasks = (tmp_path / "proj" / "tasks.py").read_text()
    assert tasks.splitlines()[:5] == [
        "import akadze_compat as celery", "import celery.exceptions",
        "from akadze_compat import shared_task",
        "from akadze_compat.contrib.abortable import AbortableTask",
        "from proj.celery import app"]
    assert '    from akadze_compat.result import AsyncResult' in tasks
    assert 'celery_helpers = "celery"  # from celery import nothing: a string' in tasks
    assert (tmp_path / "proj" / "__init__.py").read_text() == CELERY_PROJECT["proj/__init__.py"]
    assert "from akadze_compat import Celery" in (tmp_path / "proj" / "celery.py").read_text()

    shown = bash(review, tmp_path, env, strict=False).stdout
    assert "proj/tasks.py:2:import celery.exceptions" in shown, shown
    assert '"celery.beat:PersistentScheduler"' in shown and "from .celery import app" in shown
    assert "from akadze_compat import" not in shown
    assert "proj/tasks.py:4:from akadze_compat.contrib.abortable import AbortableTask" in shown
    found = bash(commands, tmp_path, env).stdout
    assert found.splitlines() == ["Procfile:1:worker: celery -A proj worker -l INFO -c 8",
                                  "Procfile:2:beat: celery -A proj beat"]

    (tmp_path / "proj" / "tasks.py").write_text(tasks.replace(
        "import celery.exceptions\n", "import akadze_compat.exceptions\n").replace(
        "celery.exceptions.Reject", "akadze_compat.exceptions.Reject"))
    (tmp_path / "proj" / "celeryconfig.py").write_text("")
    printed = python("from proj.tasks import add; print(add.apply(args=(2, 3)).get())",
                     tmp_path, env)
    assert printed.strip() == "5"


def _start(command: str, directory: Path, env: dict[str, str],
           log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=directory, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(worker: subprocess.Popen[bytes]) -> int:
    os.killpg(worker.pid, signal.SIGTERM)
    code = worker.wait(timeout=60)
    _wait_for_group_exit(worker.pid)
    return code


def test_the_worker_commands_run_tasks(tmp_path: Path, database_url: str) -> None:
    """Each command starts a worker that runs ``add`` from the queues it names and stops
    cleanly on SIGTERM."""
    proj(tmp_path)
    env = user_env(tmp_path, database_url)
    block = guide_block("celery.md", "5. Run it", "sh")
    lines = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    for number, command in enumerate(lines):
        queue = "mail" if "-Q default,mail" in command else "celery"
        log = tmp_path / f"worker{number}.log"
        worker = _start(command, tmp_path, env, log)
        try:
            # Sent at once: the second command logs at WARNING, so no "ready" line; the
            # task waits in the queue until the worker claims it.
            printed = python("from proj.tasks import add\n"
                             f"print(add.apply_async((2, 3), queue={queue!r}).get(timeout=60))",
                             tmp_path, env)
        finally:
            code = _stop(worker)
        assert printed.strip() == "5"
        assert code == 0, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()


def test_the_pytest_plugin_line(tmp_path: Path, database_url: str) -> None:
    """The block as a project's conftest.py: Celery's fixtures run a task through a real
    worker."""
    proj(tmp_path)
    write_files(tmp_path, {
        "conftest.py": guide_block("celery.md", "Testing your tasks", "python"),
        "test_add.py": '''\
            def test_add_through_a_worker(celery_app, celery_worker):
                @celery_app.task
                def mul(x, y):
                    return x * y

                celery_worker.reload()
                assert mul.delay(4, 4).get(timeout=30) == 16
            ''',
    })
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "test_add.py"], cwd=tmp_path,
                          env=user_env(tmp_path, database_url), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:]


def test_the_transactional_enqueue_block(tmp_path: Path, database_url: str,
                                         db: psycopg.Connection) -> None:
    """Both sends commit with the order row; the same block with the transaction rolled
    back leaves neither the row nor the first send."""
    proj(tmp_path)
    db.execute("CREATE TABLE orders (id int)")
    block = guide_block("celery.md", "6. Behaviour differences", "python")
    env = user_env(tmp_path, database_url)
    python(block, tmp_path, env)
    assert db.execute("SELECT id FROM orders").fetchall() == [(42,)]
    assert db.execute("SELECT task, args FROM akadze.jobs ORDER BY id").fetchall() == [
        ("proj.tasks.send_receipt", {"args": [42], "kwargs": {}})] * 2

    db.execute("DELETE FROM orders; DELETE FROM akadze.jobs")
    failing = block.replace("        send_receipt.delay(order_id)",
                            "        send_receipt.delay(order_id)\n"
                            "        raise RuntimeError('payment refused')")
    assert failing != block
    done = subprocess.run([sys.executable, "-c", failing], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "payment refused" in done.stderr
    assert db.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)


PROJ_OLD = '''\
    from celery import Celery

    app = Celery("proj_old", broker="redis://127.0.0.1:6379/{db}",
                 backend="redis://127.0.0.1:6379/{db}")
    app.conf.task_default_queue = "celery"


    @app.task
    def add(x, y):
        return x + y
    '''


def _free_redis_db() -> int:
    """A Redis database number with no keys (the drain block counts every key it sees)."""
    for number in range(15, 1, -1):
        done = subprocess.run(["redis-cli", "-n", str(number), "DBSIZE"], capture_output=True,
                              text=True, timeout=10)
        if done.stdout.strip() == "0":
            return number
    pytest.skip("no empty Redis database")


def test_the_drain_commands_on_celery(tmp_path: Path) -> None:
    """The drain checks, against a real Celery 5.7 worker on Redis: its replies come back,
    the Redis counts are printed (a queued message shows as one), RabbitMQ's list runs."""
    interpreter = celery_python()
    if shutil.which("redis-cli") is None or shutil.which("rabbitmqctl") is None:
        pytest.skip("redis-cli and rabbitmqctl are needed")
    number = _free_redis_db()
    write_files(tmp_path, {"proj_old.py": PROJ_OLD.format(db=number)})
    env = user_env(tmp_path, None)
    env["PATH"] = f"{Path(interpreter).parent}{os.pathsep}{env['PATH']}"
    block = guide_block("celery.md", "7. Switch over without losing a task", "sh")
    # redis-cli reads no database from the environment: the block's own calls run against
    # the test's database through a function of the same name.
    prelude = f'redis-cli() {{ command redis-cli -n {number} "$@"; }}\n'
    log = tmp_path / "celery-worker.log"
    worker = _start(f"{interpreter} -m celery -A proj_old worker -P solo -Q mail -l INFO",
                    tmp_path, env, log)
    try:
        _wait_for_line(log, READY, worker)
        python("from proj_old import add; add.delay(1, 2)", tmp_path, env,
               interpreter=interpreter)
        shown = bash(prelude + block, tmp_path, env, strict=False, timeout=300)
    finally:
        _stop(worker)
        subprocess.run(["redis-cli", "-n", str(number), "FLUSHDB"], capture_output=True,
                       timeout=10)
    assert shown.returncode == 0, shown.stderr[-3000:]
    # active, reserved and scheduled: each answered by the worker
    assert len(re.findall(r"-> +celery@", shown.stdout)) >= 3, shown.stdout
    assert "celery 1" in shown.stdout.splitlines(), shown.stdout  # the queued add
    assert "Listing queues" in shown.stdout + shown.stderr


def test_side_by_side_blocks_in_one_virtualenv(tmp_path: Path, database_url: str,
                                               db: psycopg.Connection) -> None:
    """Celery and akadze_compat in one interpreter (Celery 5.7's, with this project's
    packages on its path): ``send`` goes to akadze or to the Celery broker by the flag,
    and ``result_for`` finds an akadze result, else asks the legacy backend."""
    interpreter = celery_python()
    number = _free_redis_db()
    queue = f"guide-{uuid.uuid4().hex[:8]}"
    legacy = PROJ_OLD.format(db=number).replace('"proj_old"', '"proj"')
    proj(tmp_path, celery_legacy=legacy, flags="def use_akadze(name):\n"
         "    return name == 'proj.tasks.add'\n", switch=guide_block(
             "celery.md", "7. Switch over without losing a task", "python"),
         side_by_side=guide_block("celery.md", "8. Running both side by side", "python"))
    site = subprocess.run([sys.executable, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    env = user_env(tmp_path, database_url)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(PROJECT_ROOT), site])
    try:
        printed = python(textwrap.dedent(f"""
            import celery.result
            from proj.side_by_side import send
            from proj.switch import result_for
            mine = send("proj.tasks.add", (2, 3))
            theirs = send("proj.tasks.old", (1,), queue={queue!r})
            print(type(mine).__module__, type(theirs).__module__)
            print(result_for(mine.id).id == mine.id, type(result_for(mine.id)).__module__)
            old = result_for(theirs.id)
            print(isinstance(old, celery.result.AsyncResult), old.state)
        """), tmp_path, env, interpreter=interpreter)
        queued = subprocess.run(["redis-cli", "-n", str(number), "LLEN", queue],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    finally:
        subprocess.run(["redis-cli", "-n", str(number), "FLUSHDB"], capture_output=True,
                       timeout=10)
    assert printed.splitlines() == ["akadze_compat.result celery.result",
                                    "True akadze_compat.result", "True PENDING"], printed
    assert queued == "1"
    assert db.execute("SELECT task FROM akadze.jobs").fetchall() == [("proj.tasks.add",)]


# --- command lists ---------------------------------------------------------------------------

def test_command_lists_parse() -> None:
    """Blocks that list commands to pick from (job 42, a container's command) cannot run as
    a script; each must still be one the CLI accepts (a container's command from the
    program name on)."""
    from akadze_compat.bin.celery import cli as compat_cli
    from akadze_core.cli.main import cli as core_cli

    clis = {"akadze": core_cli, "akadze-compat": compat_cli}
    keys = [key for key, test in COVERED.items() if test == "test_command_lists_parse"]
    for page, title, language, index in keys:
        commands = _commands(guide_block(page, title, language, index))
        assert commands, (page, title)
        for command in commands:
            if command[0] == "docker":
                assert command[1] == "run" and "akadze" in command, command
                command = command[command.index("akadze"):]
            assert command[0] in clis, command
            _parse(clis[command[0]], command[1:])  # type: ignore[arg-type]


# --- arq.md ---------------------------------------------------------------------------------

#: ARQ's interpreter (ARQ 0.28 and httpx): ``$ARQ_PYTHON``, else this scratch venv
#: (``python3 -m venv /tmp/akadze-arq-venv && /tmp/akadze-arq-venv/bin/pip install
#: 'arq==0.28.*' httpx``).
DEFAULT_ARQ_PYTHON = "/tmp/akadze-arq-venv/bin/python"


def _arq_python() -> str | None:
    interpreter = os.environ.get("ARQ_PYTHON", DEFAULT_ARQ_PYTHON)
    return interpreter if Path(interpreter).is_file() else None


class _MailAPI:
    """A local HTTP endpoint standing in for the guide's mail API: answers ``{"id": "m-1"}``
    to a POST and keeps what was posted."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        posted = self.posted = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                body = json.dumps({"id": "m-1"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/send"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _run_service(directory: Path, env: dict[str, str], worker_command: str, health: Path,
                 producer: list[str]) -> str:
    """Start the worker, wait for its health file, run the producer (whose task is
    deferred 30 s), stop the worker; returns what the producer printed. The health file
    must be gone once the worker stopped."""
    import time

    log = directory / "worker.log"
    worker = _start(worker_command, directory, env, log)
    try:
        deadline = time.monotonic() + 60
        while not health.exists():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        done = subprocess.run(producer, cwd=directory, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (done.stderr[-3000:], log.read_text()[-3000:])
    finally:
        code = _stop(worker)
    assert code == 0, log.read_text()[-3000:]
    assert not health.exists()
    return done.stdout


def _arq_blocks() -> list[str]:
    return [guide_block("arq.md", "Side by side", "python", index) for index in range(5)]


def _named_files(blocks: list[str]) -> dict[str, str]:
    """The blocks, by the file their first line names (``# proj/tasks.py``...)."""
    files = {}
    for block in blocks:
        name = re.match(r"# ([\w/]+\.py)", block)
        assert name, block.splitlines()[0]
        files[name.group(1)] = block
    return files


def test_the_arq_service_before_the_move(tmp_path: Path) -> None:
    """The "before" side under real ARQ on Redis: its worker touches the health file,
    runs send_email 30 s after the producer enqueued it, and removes the file on SIGTERM."""
    interpreter = _arq_python()
    if interpreter is None:
        pytest.skip(f"no ARQ interpreter at {DEFAULT_ARQ_PYTHON} (set ARQ_PYTHON)")
    health = Path("/tmp/arq_worker_healthy")
    if health.exists():
        pytest.skip(f"{health} exists: another ARQ worker runs here")
    files = _named_files(_arq_blocks()[:2])
    assert set(files) == {"worker.py", "producer.py"}
    write_files(tmp_path, files)
    mail = _MailAPI()
    number = _free_redis_db()
    env = {**user_env(tmp_path, None), "MAIL_API": mail.url,
           "REDIS_URL": f"redis://127.0.0.1:6379/{number}", "PYTHONPATH": str(tmp_path)}
    arq = Path(interpreter).with_name("arq")
    try:
        printed = _run_service(tmp_path, env, f"{arq} worker.WorkerSettings", health,
                               [interpreter, "producer.py"])
    finally:
        mail.close()
        subprocess.run(["redis-cli", "-n", str(number), "FLUSHDB"], capture_output=True,
                       timeout=10)
    assert printed.strip() == "m-1"
    assert mail.posted == [{"to": "b@example.com"}]


def test_the_arq_service_after_the_move(tmp_path: Path, database_url: str) -> None:
    """The "after" side on akadze_core: the same service, the same outcome."""
    health = Path("/tmp/akadze_worker_healthy")
    if health.exists():
        pytest.skip(f"{health} exists: another akadze worker with that file runs here")
    files = _named_files(_arq_blocks()[2:])
    assert set(files) == {"proj/tasks.py", "proj/worker.py", "producer.py"}
    write_files(tmp_path, {"proj/__init__.py": "", **files})
    env = user_env(tmp_path, database_url)
    found = subprocess.run([sys.executable, "-c", "import httpx"], capture_output=True)
    if found.returncode != 0:
        # httpx is the service's own dependency, not akadze's: taken from ARQ's venv.
        interpreter = _arq_python()
        if interpreter is None:
            pytest.skip("httpx is not installed here, and there is no ARQ interpreter")
        site = Path(interpreter).parents[1] / "lib"
        packages = tmp_path / "deps"
        packages.mkdir()
        for name in ("httpx", "httpcore"):
            source = next(site.glob(f"python3*/site-packages/{name}"))
            (packages / name).symlink_to(source)
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{packages}"
    mail = _MailAPI()
    env["MAIL_API"] = mail.url
    try:
        printed = _run_service(tmp_path, env, f"{sys.executable} -m proj.worker", health,
                               [sys.executable, "producer.py"])
    finally:
        mail.close()
    assert printed.strip() == "m-1"
    assert mail.posted == [{"to": "b@example.com"}]


# --- django.md ------------------------------------------------------------------------------

#: The parts of the Django project the guide does not show: what the user has already.
DJANGO_PROJECT = {
    "manage.py": """\
        import os
        import sys

        if __name__ == "__main__":
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
            from django.core.management import execute_from_command_line
            execute_from_command_line(sys.argv)
        """,
    "proj/settings.py": """\
        import getpass
        import os

        SECRET_KEY = "guide-test-only-not-a-secret"
        INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes",
                          "django.contrib.sessions", "shop"]
        DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                                 "USER": getpass.getuser(), "PASSWORD": "",
                                 "HOST": "localhost", "PORT": "5432"}}
        USE_TZ = True
        DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
        ROOT_URLCONF = "proj.urls"
        """,
    "proj/urls.py": "urlpatterns = []\n",
    "shop/__init__.py": "",
    "shop/models.py": """\
        from django.db import models


        class Order(models.Model):
            email = models.EmailField()
            receipt_sent = models.BooleanField(default=False)
        """,
    "shop/tasks.py": """\
        from akadze_compat import shared_task
        from shop.models import Order


        @shared_task
        def send_receipt(order_id):
            Order.objects.filter(pk=order_id).update(receipt_sent=True)
            return order_id
        """,
    # The eager block's settings, applied per test as the guide says they may be.
    "shop/test_eager.py": """\
        from django.test import TestCase, override_settings

        from proj import eager_settings

        EAGER = {name: getattr(eager_settings, name) for name in dir(eager_settings)
                 if name.isupper()}


        class EagerTests(TestCase):
            def test_delay_on_commit_runs_at_once_inside_atomic(self):
                from shop.views import place_order

                with override_settings(**EAGER):
                    order, result = place_order("a@example.com")
                self.assertEqual(type(result).__name__, "EagerResult")
                self.assertEqual(result.get(), order.pk)
                order.refresh_from_db()
                self.assertTrue(order.receipt_sent)
        """,
    # The dashboard block's ASGI app, called as a server would: a staff session gets the
    # dashboard, no session gets a refusal, other paths go to Django.
    "shop/test_asgi.py": """\
        import asyncio

        from django.contrib.auth import get_user_model
        from django.test import TransactionTestCase

        from proj.celery import app as celery_app


        def status(application, path, cookie=None):
            async def run():
                headers = [(b"host", b"testserver")]
                if cookie:
                    headers.append((b"cookie", cookie.encode()))
                scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                         "method": "GET", "scheme": "http", "path": path,
                         "raw_path": path.encode(), "root_path": "", "query_string": b"",
                         "headers": headers, "client": ("127.0.0.1", 1),
                         "server": ("testserver", 80)}
                messages = [{"type": "http.request", "body": b"", "more_body": False}]
                sent = []

                async def receive():
                    if messages:
                        return messages.pop()
                    await asyncio.sleep(3600)

                async def send(message):
                    sent.append(message)

                await application(scope, receive, send)
                return next(m["status"] for m in sent if m["type"] == "http.response.start")
            return asyncio.run(run())


        class DashboardTests(TransactionTestCase):
            @classmethod
            def setUpClass(cls):
                super().setUpClass()
                celery_app.core.migrate()

            @classmethod
            def tearDownClass(cls):
                from proj.asgi import dashboard
                dashboard.state.dashboard.close()
                celery_app.core.close()
                super().tearDownClass()

            def test_staff_session_only(self):
                from proj.asgi import application

                user = get_user_model().objects.create_user("ops", password="x",
                                                            is_staff=True)
                self.client.force_login(user)
                cookie = f"sessionid={self.client.cookies['sessionid'].value}"
                self.assertEqual(status(application, "/ops/akadze/", cookie), 200)
                self.assertIn(status(application, "/ops/akadze/"), (401, 403))
                self.assertEqual(status(application, "/nothing-here/", cookie), 404)
        """,
}


def test_the_django_project_of_the_guide(tmp_path: Path, admin_url: str) -> None:
    """django.md's blocks are one Django project: its files (celery.py, __init__.py,
    views.py, tests.py, asgi.py) as written, its settings blocks appended to a settings
    module in that order, and its shell block runs the tests: the guide's real-worker test,
    the eager settings applied per test, and the mounted dashboard behind a staff session."""
    blocks = [(title, code) for title, language, _index, code in
              fenced_blocks(GUIDE / "django.md")
              if language == "python" and title != DJANGO_TASKS]
    files: dict[str, str] = dict(DJANGO_PROJECT)
    for title, code in blocks:
        first = code.splitlines()[0]
        if first.startswith("# proj/settings.py"):
            files["proj/settings.py"] = textwrap.dedent(files["proj/settings.py"]) + "\n" + code
        elif first.startswith("# in the test settings"):
            files["proj/eager_settings.py"] = code
        else:
            name = re.match(r"# ([\w/]+\.py)", first)
            assert name, (title, first)
            files[name.group(1)] = code
    assert {"proj/celery.py", "proj/__init__.py", "shop/views.py", "shop/tests.py",
            "proj/asgi.py", "proj/eager_settings.py"} <= files.keys()
    write_files(tmp_path, files)
    command = guide_block("django.md", "Testing", "sh")
    assert "localhost:5432/test_shop" in command
    if not re.search(r"@(localhost|127\.0\.0\.1):5432/", admin_url):
        pytest.skip("the block names a Postgres on localhost:5432")

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS test_shop WITH (FORCE)")

    drop()
    try:
        done = bash(command, tmp_path, user_env(tmp_path, None), strict=False, timeout=600)
    finally:
        drop()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert re.search(r"Ran 3 tests? in", output) and "OK" in output, output[-3000:]


DJANGO_TASKS_PROJECT = {
    "manage.py": """\
        import os
        import sys

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
        """,
    "proj/__init__.py": "",
    "proj/settings.py": """\
        import os

        from psycopg.conninfo import conninfo_to_dict

        _db = conninfo_to_dict(os.environ["SHOP_DATABASE_URL"])
        SECRET_KEY = "guide-test-only"
        INSTALLED_APPS = ["shop"]
        DATABASES = {"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": _db["dbname"],
            "USER": _db.get("user", ""), "PASSWORD": _db.get("password", ""),
            "HOST": _db.get("host", ""), "PORT": _db.get("port", "")}}
        USE_TZ = True
        DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
        """,
    "shop/__init__.py": "",
    "shop/models.py": """\
        from django.db import models


        class Order(models.Model):
            email = models.CharField(max_length=200)
            receipt_sent = models.BooleanField(default=False)
        """,
    "shop/migrations/__init__.py": "",
    "shop/migrations/0001_initial.py": """\
        from django.db import migrations, models


        class Migration(migrations.Migration):
            initial = True
            dependencies = []
            operations = [migrations.CreateModel("Order", fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("email", models.CharField(max_length=200)),
                ("receipt_sent", models.BooleanField(default=False))])]
        """,
}

DJANGO_TASKS_CHECK = """\
import os, sys, time
import django

django.setup()
from django.db import transaction
from django.tasks.exceptions import TaskResultDoesNotExist
from shop.models import Order
from shop.tasks import send_receipt
from shop.views import place_order, receipt_status

order, result = place_order("c@example.com")
print("enqueued", result.status)
deadline = time.monotonic() + 60
while receipt_status(result.id)[0] != "SUCCESSFUL" and time.monotonic() < deadline:
    time.sleep(0.2)
order.refresh_from_db()
print("finished", *receipt_status(result.id), order.receipt_sent)
try:
    with transaction.atomic():
        rolled = send_receipt.enqueue(order.pk)
        raise RuntimeError
except RuntimeError:
    pass
try:
    send_receipt.get_result(rolled.id)
except TaskResultDoesNotExist:
    print("rolled back: no job")
"""


def test_the_django_tasks_section(tmp_path: Path, empty_database_url: str) -> None:
    """django.md's ``django.tasks`` section is one Django 6 project: its settings block
    appended to a settings module, its tasks and views as written, its shell block run as
    given (the worker line in the background); a view's order gets its receipt from the
    worker, and a rolled-back enqueue leaves no job."""
    from tests.django6.test_backend import django6_python

    interpreter = Path(django6_python())
    files: dict[str, str] = dict(DJANGO_TASKS_PROJECT)
    for title, language, _index, code in fenced_blocks(GUIDE / "django.md"):
        if title != DJANGO_TASKS or language != "python":
            continue
        name = re.match(r"# ([\w/]+\.py)", code.splitlines()[0])
        assert name, code
        path = name.group(1)
        files[path] = (textwrap.dedent(files[path]) + "\n" + code) if path in files else code
    assert {"proj/settings.py", "shop/tasks.py", "shop/views.py"} <= files.keys()
    write_files(tmp_path, files)
    env = {"PATH": f"{interpreter.parent}{os.pathsep}/usr/bin:/bin",
           "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PROJECT_ROOT)]),
           "SHOP_DATABASE_URL": empty_database_url, "PYTHONUNBUFFERED": "1"}
    command = guide_block("django.md", DJANGO_TASKS, "sh")
    lines = command.strip().splitlines()
    assert lines[-1].startswith("python manage.py akadze worker")
    setup = bash("\n".join(lines[:-1]), tmp_path, env, timeout=300)
    assert "applied migrations" in setup.stdout, setup.stdout
    worker = subprocess.Popen(["bash", "-c", lines[-1]], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        done = subprocess.run([str(interpreter), "-c", DJANGO_TASKS_CHECK], cwd=tmp_path,
                              env={**env, "DJANGO_SETTINGS_MODULE": "proj.settings"},
                              capture_output=True, text=True, timeout=120)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        log, _ = worker.communicate(timeout=60)
    assert done.returncode == 0, (done.stderr[-3000:], log[-3000:])
    assert done.stdout.splitlines() == [
        "enqueued READY", "finished SUCCESSFUL 1 True", "rolled back: no job"], log[-3000:]


def test_the_third_party_page_blocks_run(tmp_path: Path) -> None:
    """third-party.md's blocks, run by its own tests (tests/addons/test_third_party_guide.py:
    python without AKADZE_CELERY, each switching the alias on by its first line; the shell
    block prints what its comment says)."""
    from tests.addons import test_third_party_guide as page

    for index in range(len(page.blocks("python"))):
        page.test_python_blocks_run_as_written(index, tmp_path)
    page.test_the_shell_block_prints_what_its_comment_says(tmp_path)
