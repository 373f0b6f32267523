"""The ``akadze-compat`` command line, run for real against the sample project plainproj.

Tasks are sent with ``akadze-compat call`` and read with ``akadze-compat result``, so this
module never imports the project itself.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from akadze_compat.bin.base import CliError, find_app, nodename
from akadze_core.model.dsn import redact
from tests.compat.cli_harness import (
    CompatWorker,
    command,
    environment,
    error_lines,
    run,
    wait_until,
)
from tests.compat.conftest import SpawnCompat
from tests.helpers import is_uuid4, job_of_task

pytestmark = pytest.mark.slow

NODE = f"cli@{socket.gethostname()}"


@pytest.fixture(scope="module")
def cli_worker(module_database_url: str, module_spawn_compat: SpawnCompat) -> CompatWorker:
    """A threads worker on the queues ``cli`` and ``clislow``, with flags it ignores."""
    worker = module_spawn_compat(
        "-b", module_database_url, "-A", "plainproj", "worker", "-P", "threads", "-c", "2",
        "-Q", "cli,clislow", "-n", "cli@%h", "-l", "INFO", "--without-gossip",
        "--without-mingle", "-E", "--frobnicate")
    worker.wait_ready()
    return worker


@pytest.fixture
def url(module_database_url: str, cli_worker: CompatWorker) -> str:
    return module_database_url


def cli(url: str, *args: str, input: str | None = None) -> tuple[int, str, str]:
    done = run("-b", url, "-A", "plainproj", *args, input=input)
    return done.returncode, done.stdout, done.stderr


def call(url: str, name: str, *args: str) -> str:
    code, out, err = cli(url, "call", name, *args)
    assert code == 0, err
    return out.strip()


# --- the command line itself ---------------------------------------------------------------

def test_help_and_version() -> None:
    done = run("--help")
    assert done.returncode == 0
    for name in ("worker", "beat", "purge", "inspect", "status", "call", "result", "migrate"):
        assert name in done.stdout
    assert "--max-tasks-per-child" in run("worker", "--help").stdout
    assert run("--version").stdout.startswith("akadze-compat ")


def test_unknown_flags_warn_and_the_worker_runs(cli_worker: CompatWorker) -> None:
    log = cli_worker.log()
    for flag in ("--without-gossip", "--without-mingle", "-E/--task-events/--events"):
        assert f"akadze-compat: warning: {flag} is ignored" in log
    assert "akadze-compat: warning: unknown option '--frobnicate' is ignored" in log
    assert f"{NODE} ready." in log


def test_worker_without_app_is_one_line() -> None:
    done = run("worker")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "akadze-compat: error: no app given: name it with -A, e.g. akadze-compat -A proj worker"]


def test_app_option_after_the_command_is_explained(module_database_url: str) -> None:
    done = run("-b", module_database_url, "worker", "-A", "plainproj")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "akadze-compat: error: -A/--app goes before the command: akadze-compat -A proj worker"]


@pytest.mark.parametrize("spec", ["plainproj", "plainproj.celery", "plainproj.celery:app",
                                  "plainproj.celery.app", "plainproj:celery_app"])
def test_app_spellings_find_the_app(spec: str) -> None:
    done = run("-A", spec, "doctor", "--json")
    assert done.returncode == 0, done.stderr
    names = [task["name"] for task in json.loads(done.stdout)["tasks"]]
    assert {"plainproj.billing.tasks.add", "plainproj.reports.tasks.remind",
            "plainproj.celery.debug_task"} <= set(names)


@pytest.mark.parametrize(("spec", "message"), [
    ("nosuchproject", "unable to load the app: module 'nosuchproject' was not found"),
    ("plainproj.celeryconfig", "unable to load the app: module 'plainproj.celeryconfig' has "
                               "no attribute 'app'"),
    ("plainproj.celery:nothing", "unable to load the app 'plainproj.celery:nothing'"),
    ("plainproj.api:wait_for", "'plainproj.api:wait_for' is not a Celery app"),
])
def test_bad_app_is_one_line(spec: str, message: str) -> None:
    done = run("-A", spec, "doctor")
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("akadze-compat: error: "), done.stderr
    assert message in lines[0]


def test_find_app_takes_the_first_celery_instance(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "loneapp.py").write_text(textwrap.dedent("""
        from akadze_compat import Celery
        flask_app = object()
        worker_app = Celery("lone", set_as_current=False)
    """))
    package = tmp_path / "pkgproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "celery.py").write_text(
        "from akadze_compat import Celery\ncelery = Celery('pkg', set_as_current=False)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert find_app("loneapp").main == "lone"
        assert find_app("pkgproj").main == "pkg"  # the submodule `celery`, its `celery`
        assert find_app("pkgproj.celery:celery").main == "pkg"
        with pytest.raises(CliError, match="is not a Celery app"):
            find_app("loneapp:flask_app")
    finally:
        for name in ("loneapp", "pkgproj", "pkgproj.celery"):
            sys.modules.pop(name, None)


def test_node_names_follow_celery() -> None:
    host = socket.gethostname()
    assert nodename(None) == f"celery@{host}"
    assert nodename("w1@%h") == f"w1@{host}"
    assert nodename("w2") == "celery@w2"


@pytest.mark.parametrize("command", [["worker", "-P", "solo"], ["status"],
                                     ["call", "plainproj.billing.tasks.add"]])
def test_non_postgres_broker_is_one_line_without_password(command: list[str]) -> None:
    done = run("-b", "redis://default:s3cretRedisPw@localhost:6379/0", "-A", "plainproj",
               *command)
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("akadze-compat: error: broker_url ")
    assert "is not a Postgres URL" in lines[0]
    assert "s3cretRedisPw" not in done.stderr + done.stdout


def test_a_redis_broker_in_the_code_gets_advice_that_works(tmp_path: Path,
                                                           empty_database_url: str) -> None:
    (tmp_path / "redisproj.py").write_text(
        "from akadze_compat import Celery\n"
        "app = Celery('redisproj', broker='redis://:s3cretRedisPw@localhost:6379/0')\n")
    # $AKADZE_DATABASE_URL does not override a broker_url the project sets: not advised.
    done = run("-A", "redisproj", "migrate", cwd=tmp_path,
               env={"AKADZE_DATABASE_URL": empty_database_url})
    lines = error_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "Change broker_url where the project sets it (Celery(broker=...) or its config) " \
           "to postgresql://user@host/db, or override it with -b URL or $CELERY_BROKER_URL" \
           in lines[0]
    assert "($AKADZE_DATABASE_URL is used only when no broker_url is set)" in lines[0]
    assert "s3cretRedisPw" not in done.stderr
    # Each override it names works.
    done = run("-b", empty_database_url, "-A", "redisproj", "migrate", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("applied migrations 1"), done
    done = run("-A", "redisproj", "migrate", cwd=tmp_path,
               env={"CELERY_BROKER_URL": empty_database_url})
    assert done.returncode == 0 and "schema already up to date in " in done.stdout, done


def test_unreachable_database_is_one_line_without_password() -> None:
    done = run("-b", "postgresql://postgres:hunter2pw@127.0.0.1:1/nothing", "status")
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "cannot connect to Postgres" in lines[0], done.stderr
    assert "hunter2pw" not in done.stderr + done.stdout


def test_migrate_then_a_worker_on_an_empty_database(empty_database_url: str) -> None:
    for args in (["worker", "-P", "solo"], ["worker", "-c", "2"]):
        done = run("-b", empty_database_url, "-A", "plainproj", *args, "-l", "INFO")
        assert done.returncode == 1
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "akadze-compat migrate" in errors[0], done.stderr
    # Trust authentication ignores the password: it is here to be kept out of the output.
    with_password = make_conninfo(empty_database_url, password="Migr8-pw")
    shown = redact(with_password)
    first = run("-b", with_password, "migrate")
    assert first.returncode == 0 and first.stdout.startswith("applied migrations 1"), first
    assert first.stdout.rstrip().endswith(f" in {shown}"), first.stdout
    again = run("-b", with_password, "migrate")
    assert again.stdout.strip() == f"schema already up to date in {shown}: nothing to do"
    assert "Migr8-pw" not in first.stdout + first.stderr + again.stdout + again.stderr


@pytest.mark.slow
def test_migrate_names_the_embedded_postgres(tmp_path: Path) -> None:
    home = tmp_path / "e"  # short: the server's socket path must fit in 107 bytes
    done = run("migrate", cwd=tmp_path, env={"AKADZE_HOME": str(home)}, timeout=120)
    assert done.returncode == 0, done.stderr
    # Creating the embedded Postgres applies the schema: migrate says where it looked.
    assert done.stdout.strip() == ("schema already up to date in the embedded Postgres in "
                                   f"{home / 'pgdata'}: nothing to do")


COMPAT_SCHEMA_LINE = ("akadze-compat: error: the akadze schema is not applied to this "
                      "database: run `akadze-compat migrate`")


def test_every_command_words_a_missing_schema_alike(empty_database_url: str) -> None:
    """One line, the same in every command, naming this command's migrate and no SQL."""
    for args in (["worker", "-P", "solo"], ["inspect", "active"], ["status"], ["purge", "-f"],
                 ["result", "0f3c"], ["call", "plainproj.billing.tasks.charge"]):
        done = run("-b", empty_database_url, "-A", "plainproj", *args)
        assert done.returncode == 1, (args, done.stderr)
        assert error_lines(done.stderr)[-1:] == [COMPAT_SCHEMA_LINE], (args, done.stderr)
        assert "relation" not in done.stderr and "SELECT" not in done.stderr


def test_beat_runs_only_the_scheduler(database_url: str, db: psycopg.Connection,
                                      tmp_path: Path) -> None:
    """`beat` enqueues the beat_schedule's ticks with no worker, and stops on SIGTERM."""
    (tmp_path / "beatproj.py").write_text(textwrap.dedent("""
        from akadze_compat import Celery

        app = Celery("beatproj")
        app.conf.beat_schedule = {"tick": {"task": "beatproj.tick", "schedule": 1.0}}

        @app.task
        def tick():
            return "tock"
    """))
    process = subprocess.Popen(
        [*command(), "-A", "beatproj", "-b", database_url, "beat", "--scheduler", "x.y:Z"],
        cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        wait_until(lambda: db.execute("SELECT count(*) FROM akadze.jobs"
                                      " WHERE task = 'beatproj.tick'").fetchone()[0] >= 1, 20)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "1 periodic tasks" in out
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, err
    assert warnings[0].endswith(
        " WARNING akadze_compat.beat: --scheduler x.y:Z is not supported: the schedules x.y:Z "
        "keeps or computes will not run; only beat_schedule and add_periodic_task entries do "
        '(migration_guide/celery.md, "Beat runs inside the workers")'), warnings
    # Nothing ran the job: beat only schedules.
    assert db.execute("SELECT state FROM akadze.jobs WHERE task = 'beatproj.tick'"
                      " LIMIT 1").fetchone()[0] == "queued"


SCHEDULER_PROJECT = """
    from akadze_compat import Celery

    app = Celery("schedproj")
    app.conf.beat_scheduler = {scheduler!r}
    app.conf.beat_schedule = {{"tick": {{"task": "schedproj.tick", "schedule": 3600}}}}

    @app.task
    def tick():
        return "tock"
"""


def _scheduler_project(tmp_path: Path, scheduler: str) -> Path:
    (tmp_path / "schedproj.py").write_text(textwrap.dedent(SCHEDULER_PROJECT.format(
        scheduler=scheduler)))
    return tmp_path


def _warnings(log: str) -> list[str]:
    """The WARNING lines about a scheduler (the test database may draw others)."""
    return [line for line in log.splitlines()
            if "WARNING" in line and "is not supported" in line]


@pytest.mark.parametrize(("setting", "option", "named", "lost"), [
    ("redbeat.RedBeatScheduler", None, "beat_scheduler redbeat:RedBeatScheduler",
     "the schedules RedBeat keeps in Redis"),
    ("celery.beat:PersistentScheduler", "redbeat.RedBeatScheduler",
     "--scheduler redbeat:RedBeatScheduler", "the schedules RedBeat keeps in Redis"),
    ("myproj.scheduling:Scheduler", None, "beat_scheduler myproj.scheduling:Scheduler",
     "the schedules myproj.scheduling:Scheduler keeps or computes"),
])
def test_worker_and_beat_name_a_scheduler_they_cannot_honour(
        database_url: str, spawn_compat: SpawnCompat, tmp_path: Path, setting: str,
        option: str | None, named: str, lost: str) -> None:
    """One WARNING line at start, from the worker and from beat, naming what will not run."""
    project = _scheduler_project(tmp_path, setting)
    extra = ["--scheduler", option] if option else []
    worker = spawn_compat("-b", database_url, "-A", "schedproj", "worker", "-P", "solo",
                          "-l", "INFO", *extra, cwd=project)
    worker.wait_ready()
    beat = spawn_compat("-b", database_url, "-A", "schedproj", "beat", *extra, cwd=project)
    beat.wait_log("1 periodic tasks")
    for log in (worker.log(), beat.log()):
        warnings = _warnings(log)
        assert len(warnings) == 1, log
        assert f"{named} is not supported: {lost}" in warnings[0]
        assert "will not run; only beat_schedule and add_periodic_task entries do" \
            in warnings[0]
    assert "--scheduler" not in worker.log().replace(named, "")  # not also "ignored"


def test_the_default_scheduler_draws_no_warning(
        database_url: str, spawn_compat: SpawnCompat, tmp_path: Path) -> None:
    project = _scheduler_project(tmp_path, "celery.beat.PersistentScheduler")
    worker = spawn_compat("-b", database_url, "-A", "schedproj", "worker", "-P", "solo",
                          "-l", "INFO", cwd=project)
    worker.wait_ready()
    assert _warnings(worker.log()) == []


def test_doctor_lists_a_scheduler_it_cannot_honour(tmp_path: Path) -> None:
    project = _scheduler_project(tmp_path, "redbeat.RedBeatScheduler")
    done = run("-A", "schedproj", "doctor", cwd=project)
    assert done.returncode == 1, done.stderr  # a missing finding
    text = " ".join(done.stdout.split())
    assert "beat_scheduler" in text and "redbeat:RedBeatScheduler is not supported" in text
    assert "the schedules RedBeat keeps in Redis will not run" in text
    report = json.loads(run("-A", "schedproj", "doctor", "--json", cwd=project).stdout)
    found = [item for item in report["findings"] if item["key"] == "beat_scheduler"]
    assert [item["kind"] for item in found] == ["missing"]


# --- commands against a live worker -----------------------------------------------------------

def test_call_and_result(url: str) -> None:
    task_id = call(url, "plainproj.billing.tasks.add", "-a", "[2, 3]", "--queue", "cli")
    assert is_uuid4(task_id)
    code, out, err = cli(url, "result", task_id, "--timeout", "20")
    assert (code, out) == (0, "5\n"), err
    task_id = call(url, "plainproj.celery.debug_task", "--queue", "clislow")
    code, out, err = cli(url, "result", task_id, "--timeout", "20")
    assert code == 0 and f"'hostname': '{NODE}'" in out, err  # -n cli@%h


def test_result_of_a_failed_task_is_one_line_and_traceback(url: str) -> None:
    task_id = call(url, "plainproj.billing.tasks.sync_ledger", "-k", '{"account": "a1"}',
                   "--queue", "cli")
    code, out, err = cli(url, "result", task_id, "--timeout", "30")
    assert code == 1
    assert error_lines(err) == [f"akadze-compat: error: task {task_id} ended FAILURE: "
                                "LedgerUnavailable: ledger unreachable for a1"]
    code, out, _ = cli(url, "result", task_id, "--traceback")
    assert code == 0 and "LedgerUnavailable: ledger unreachable for a1" in out


def test_an_unregistered_task_is_logged_the_way_celery_says_it(
        url: str, cli_worker: CompatWorker) -> None:
    task_id = call(url, "plainproj.nowhere.tasks.ghost", "--queue", "cli")
    # The line names the job (the core's hook gets its id, not the task id in its meta).
    with psycopg.connect(url) as connection:
        row = [job_of_task(connection, task_id)["id"]]
    line = re.compile(rf"ERROR/MainProcess\] Received unregistered task of type "
                      rf"'plainproj\.nowhere\.tasks\.ghost'\. Job {row[0]} failed with "
                      rf"NotRegistered: is the module that defines it imported by this worker")
    cli_worker.wait_log(line)
    code, _, err = cli(url, "result", task_id, "--timeout", "20")
    assert code == 1 and "NotRegistered" in err, err
    # Celery's one line, not the engine's too.
    assert f"job {task_id} plainproj.nowhere" not in cli_worker.log()


def test_result_timeout_is_one_line(url: str) -> None:
    task_id = call(url, "plainproj.reports.tasks.remind", "-a", '["later"]', "--countdown",
                   "60", "--queue", "cli")
    code, _, err = cli(url, "result", task_id, "--timeout", "0.5")
    assert code == 1
    assert error_lines(err) == [f"akadze-compat: error: task {task_id} did not finish within "
                                "0.5s (state PENDING)"]
    assert cli(url, "purge", "-f", "-Q", "cli")[0] == 0


def test_call_rejects_bad_json(url: str) -> None:
    code, _, err = cli(url, "call", "plainproj.billing.tasks.add", "-a", '{"x": 1}')
    assert code == 2 and "--args must be a JSON array" in err


def test_status_lists_the_node(url: str) -> None:
    code, out, _ = cli(url, "status")
    assert code == 0
    assert f"->  {NODE}: OK" in out and "1 node online." in out
    code, out, _ = cli(url, "status", "--json")
    assert json.loads(out.splitlines()[0]) == {NODE: {"ok": "pong"}}


def test_inspect_ping_with_destination(url: str) -> None:
    assert cli(url, "inspect", "ping", "-d", NODE)[0] == 0
    code, _, err = cli(url, "inspect", "ping", "-d", "nobody@nowhere", "-t", "0.3")
    assert code == 69 and "No nodes replied within time constraint" in err
    code, out, _ = cli(url, "inspect", "active_queues", "--json")
    assert [queue["name"] for queue in json.loads(out)[NODE]] == ["cli", "clislow"]
    code, out, _ = cli(url, "inspect", "reserved", "--json")
    assert json.loads(out) == {NODE: []}


def test_inspect_active_shows_the_running_task(url: str) -> None:
    # Long enough to outlast the two inspect calls below, each a CLI start (8 s was not, on
    # a loaded machine); short enough to end before the module's worker is stopped.
    task_id = call(url, "plainproj.reports.tasks.nap", "-a", "[25]", "--queue", "clislow")

    def active() -> list[dict]:
        code, out, _ = cli(url, "inspect", "active", "--json")
        return json.loads(out).get(NODE, []) if code == 0 else []

    running = wait_until(active, timeout=20)
    assert isinstance(running, list)
    entry = next(item for item in running if item["id"] == task_id)
    assert entry["name"] == "plainproj.reports.tasks.nap"
    assert entry["args"] == [25] and entry["hostname"] == NODE
    assert entry["delivery_info"]["routing_key"] == "clislow"
    code, out, _ = cli(url, "inspect", "active")
    assert code == 0
    assert f"->  {NODE}: OK" in out and "plainproj.reports.tasks.nap" in out


def test_inspect_scheduled_and_stats(url: str) -> None:
    task_id = call(url, "plainproj.reports.tasks.remind", "-a", '["hello"]', "--countdown",
                   "120", "--queue", "cli")
    code, out, _ = cli(url, "inspect", "scheduled", "--json")
    assert code == 0
    entry = next(item for item in json.loads(out)[NODE] if item["request"]["id"] == task_id)
    assert entry["request"]["args"] == ["hello"] and entry["eta"]
    code, out, _ = cli(url, "inspect", "stats", "--json")
    stats = json.loads(out)[NODE]
    assert stats["pool"]["max-concurrency"] == 2 and stats["pid"] == cli_worker_pid(url)
    assert cli(url, "purge", "-f", "-Q", "cli")[0] == 0


def cli_worker_pid(url: str) -> int:
    """The pid the CLI test worker registered under."""
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT pid FROM akadze.workers WHERE name = %s",
                                 (NODE,)).fetchone()
    assert row is not None
    return int(row[0])


def test_inspect_unknown_command_is_a_usage_error(url: str) -> None:
    code, _, err = cli(url, "inspect", "bogus")
    assert code == 2
    assert "Command bogus not recognized" in err and len(error_lines(err)) == 1
    code, _, err = cli(url, "control", "ping")  # ping is an inspect command
    assert code == 2 and "Available control commands: add_consumer" in err


def test_purge_asks_then_deletes_waiting_tasks(url: str, module_database_url: str) -> None:
    for _ in range(3):
        call(url, "plainproj.reports.tasks.remind", "-a", '["x"]', "--queue", "purgeme")
    code, out, err = cli(url, "purge", "-Q", "purgeme", input="n\n")
    assert code == 1 and "There is no undo" in out and "aborted" in err
    code, out, _ = cli(url, "purge", "-Q", "purgeme", input="y\n")
    assert code == 0 and "Purged 3 messages from 1 known task queue." in out
    with psycopg.connect(module_database_url) as connection:
        left = connection.execute(
            "SELECT count(*) FROM akadze.jobs WHERE queue = 'purgeme'").fetchone()
    assert left == (0,)
    code, out, _ = cli(url, "purge", "-f", "-Q", "purgeme")
    assert code == 0 and out.strip() == "No messages purged from 1 queue."


@pytest.fixture(scope="module", autouse=True)
def _worker_stops_cleanly(cli_worker: CompatWorker) -> Iterator[None]:
    """After the module: SIGTERM stops the shared worker with exit code 0."""
    yield
    cli_worker.terminate()
    assert cli_worker.wait_exit() == 0, cli_worker.log()


PRINT_PASSWORD = "Pr1nt-S3cret"


@pytest.mark.parametrize("pool", [["-P", "solo"], ["-P", "prefork", "-c", "1"]],
                         ids=["solo", "prefork"])
def test_what_a_task_prints_is_scrubbed_of_the_broker_password(
        database_url: str, spawn_compat: SpawnCompat, tmp_path: Path, pool: list[str]) -> None:
    """print() output goes to the worker's stdout as it is (worker_redirect_stdouts is not
    honoured), but never with the database password in it."""
    (tmp_path / "printproj.py").write_text(textwrap.dedent('''
        import sys
        from akadze_compat import Celery

        app = Celery("printproj")

        @app.task(name="printproj.show")
        def show():
            url = app.conf.broker_url
            print("connecting to", url)
            print("the secret is", url.split(":")[2].split("@")[0], file=sys.stderr)
            print("done printing", flush=True)
    '''))
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    broker = (f"postgresql://{params['user']}:{PRINT_PASSWORD}@{params['host']}:"
              f"{params.get('port', 5432)}/{params['dbname']}")
    worker = spawn_compat("-b", broker, "-A", "printproj", "worker", *pool, "-l", "INFO",
                          cwd=tmp_path)
    worker.wait_ready()
    _send_task(database_url, "printproj.show")
    worker.wait_log("done printing")
    worker.wait_log("the secret is ***")
    log = worker.log()
    assert PRINT_PASSWORD not in log, log
    assert f"connecting to postgresql://{params['user']}:***@" in log


def test_a_cold_shutdown_does_not_wait_for_a_thread_its_cancelled_task_left(
        database_url: str, spawn_compat: SpawnCompat, tmp_path: Path) -> None:
    """An ``async def`` task blocked in ``asyncio.to_thread`` (a call that never returns):
    after a cold shutdown cancels it, the worker exits (1, as Celery after a cold shutdown)
    without waiting for that thread."""
    (tmp_path / "stuckproj.py").write_text(textwrap.dedent('''
        import asyncio
        import threading

        from akadze_compat import Celery

        app = Celery("stuckproj")
        never = threading.Event()

        @app.task(name="stuckproj.stuck")
        async def stuck():
            print("stuck in its thread", flush=True)
            await asyncio.to_thread(never.wait)
    '''))
    worker = spawn_compat("-b", database_url, "-A", "stuckproj", "worker", "-P", "threads",
                          "-l", "INFO", cwd=tmp_path)
    worker.wait_ready()
    _send_task(database_url, "stuckproj.stuck")
    worker.wait_log("stuck in its thread")
    worker.terminate(signal.SIGQUIT)
    assert worker.wait_exit(timeout=15) == 1, worker.log()
    assert "not waiting for 1 thread(s) of asyncio.to_thread" in worker.log()


def _send_task(database_url: str, name: str) -> None:
    """Send task ``name`` by name from a client app of its own, closed afterwards."""
    from akadze_compat import Celery

    client = Celery("client", broker=database_url, set_as_current=False)
    try:
        client.send_task(name)
    finally:
        if client._core is not None:
            client._core.close()
        client.close()


def _real_celery_project(root: Path) -> None:
    """A project still importing ``celery``, with a stand-in for the real package installed
    beside akadze (its class is ``celery.app.base.Celery``, as the real one's)."""
    (root / "celery" / "app").mkdir(parents=True)
    (root / "celery" / "__init__.py").write_text(
        "from celery.app.base import Celery\n__version__ = '5.7.0'\n")
    (root / "celery" / "app" / "__init__.py").write_text("")
    (root / "celery" / "app" / "base.py").write_text("class Celery:\n"
                                                      "    def __init__(self, main):\n"
                                                      "        self.main = main\n")
    (root / "proj").mkdir()
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "celery.py").write_text("from celery import Celery\napp = Celery('proj')\n")


@pytest.mark.parametrize("spec", ["proj.celery:app", "proj", "proj.celery"])
def test_an_app_of_the_real_celery_is_named_with_the_way_out(tmp_path: Path, spec: str) -> None:
    _real_celery_project(tmp_path)
    # The command turns the celery alias on: the project's `celery` is akadze_compat.
    assert run("-A", spec, "doctor", cwd=tmp_path).returncode == 0
    # Refused, the real celery's app is found, and named.
    done = run("-A", spec, "doctor", cwd=tmp_path, env={"AKADZE_CELERY": "0"})
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("akadze-compat: error: 'proj.celery:app' is a "
                               f"celery.app.base.Celery (celery 5.7.0 at {tmp_path / 'celery'}),"
                               " not an akadze_compat app: "), lines[0]
    assert "`from akadze_compat import Celery`" in lines[0]
    assert "AKADZE_CELERY=1" in lines[0]


BEAT_PROJECT = """\
from akadze_compat import Celery
from akadze_compat.schedules import crontab

app = Celery("beatproj")
app.conf.beat_schedule = {
    "every-2s": {"task": "beatproj.ping", "schedule": 2.0},
    "nightly": {"task": "beatproj.ping", "schedule": crontab(hour=3, minute=0),
                "options": {"queue": "night"}},
}


@app.task
def ping():
    return "pong"
"""


def test_schedules_lists_the_apps_beat_schedule(tmp_path: Path, database_url: str) -> None:
    (tmp_path / "beatproj.py").write_text(BEAT_PROJECT)
    done = run("-b", database_url, "-A", "beatproj", "schedules", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert [(entry["name"], entry["task"], entry["trigger"], entry["queue"], entry["source"],
             entry["last_run"]) for entry in entries] == [
        ("every-2s", "beatproj.ping", "every 2s", "celery", "code", None),
        ("nightly", "beatproj.ping", "celery-crontab 0 3 * * * tz=UTC", "night", "code", None)]
    table = run("-b", database_url, "-A", "beatproj", "schedules", cwd=tmp_path).stdout
    assert table.splitlines()[0].split() == ["NAME", "TASK", "TRIGGER", "QUEUE", "LAST_RUN",
                                             "NEXT_RUN"]
    assert table.splitlines()[1].startswith("every-2s ")
