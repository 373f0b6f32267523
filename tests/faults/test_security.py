"""Security: no pickle anywhere, passwords never shown, least-privilege roles.

See SECURITY.md; the least-privilege test runs that document's SQL blocks verbatim.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import errors

from akadze_core import App
from akadze_core.cli.main import cli
from akadze_core.store.migrations import migrate
from tests.faults.conftest import SpawnWorker
from tests.faults.fault_app import build_fault_app
from tests.faults.support import count, error_types, job, one_line, rows_by_id, wait_until
from tests.workers.support import PROJECT_ROOT, RUNS_TABLE, PrivateCluster

PACKAGES = ("akadze_core", "akadze_compat")
#: Modules that turn bytes into arbitrary objects (marshal is built in: checked in the source).
UNSAFE_LOADERS = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "shelve", "jsonpickle",
                  "marshal"}

IMPORT_PROBE = r"""
import builtins, importlib, json, pkgutil, sys

UNSAFE = set(json.loads(sys.argv[1]))
importers = []  # (unsafe module, the module whose code imported it)

original = builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] in UNSAFE:
        importers.append((name, (globals or {}).get("__name__")))
    return original(name, globals, locals, fromlist, level)
builtins.__import__ = spy

class Finder:  # sees importlib.import_module too, for modules not loaded yet
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in UNSAFE:
            frame = sys._getframe(1)
            while frame and (frame.f_globals.get("__name__", "").startswith("importlib")
                             or frame.f_code.co_name == "spy"):
                frame = frame.f_back
            importers.append((name, frame.f_globals.get("__name__") if frame else None))
        return None
sys.meta_path.insert(0, Finder())

report = {}
EXTRAS = "akadze_core.dashboard"  # an optional extra: imported last, on its own
# Integrations import their framework (Django 6's django.tasks), which may not be installed:
# the source scan below covers them.
FRAMEWORKS = "akadze_core.contrib."

def walk(path, prefix):  # pkgutil.walk_packages, minus the extras (it imports packages)
    for info in pkgutil.iter_modules(path, prefix):
        if info.name.startswith((EXTRAS, FRAMEWORKS)):
            continue
        yield info.name
        if info.ispkg:
            yield from walk(importlib.import_module(info.name).__path__, info.name + ".")

for package in json.loads(sys.argv[2]):
    before = set(sys.modules)
    root = importlib.import_module(package)
    names = [package] + list(walk(root.__path__, package + "."))
    for name in names:
        importlib.import_module(name)
    report[package] = {"modules": names,
                       "loaded": sorted(m for m in set(sys.modules) - before
                                        if m.split(".")[0] in UNSAFE and m != "marshal")}
extras = importlib.import_module(EXTRAS)
report["extras"] = [EXTRAS] + [
    m.name for m in pkgutil.walk_packages(extras.__path__, EXTRAS + ".")]
for name in report["extras"]:
    importlib.import_module(name)
report["importers"] = importers
print(json.dumps(report))
"""


# --- no pickle ---------------------------------------------------------------------------------


def test_no_akadze_module_imports_pickle_or_friends() -> None:
    """Import every module of both packages in a fresh interpreter, spying on imports."""
    probe = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, json.dumps(sorted(UNSAFE_LOADERS)),
         json.dumps(PACKAGES)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout.splitlines()[-1])
    assert len(report["akadze_core"]["modules"]) > 15, report
    # akadze_core, imported first and alone, never even loads pickle.
    assert report["akadze_core"]["loaded"] == [], report
    # No akadze module imports an unsafe loader, directly or through importlib. (kombu, a
    # dependency of the facade, imports multiprocessing, which imports pickle: allowed.)
    offenders = [(name, importer) for name, importer in report["importers"]
                 if (importer or "").split(".")[0] in PACKAGES]
    assert offenders == [], offenders
    # _pytest: the facade's pytest plugin (akadze_compat.contrib.pytest) imports pytest, whose
    # assertion rewriting caches bytecode with marshal; it is loaded only inside pytest.
    # jinja2: the dashboard's templates; its bytecode-cache module (jinja2.bccache) imports
    # pickle, and the dashboard configures no bytecode cache.
    assert len(report["extras"]) > 3, report
    # logging: kombu.log imports logging.handlers, whose SocketHandler pickles (it never
    # unpickles) and so imports pickle.
    allowed_importers = {"multiprocessing", "pickle", "kombu", "copyreg", "_pytest", "jinja2",
                         "logging"}
    assert {(importer or "").split(".")[0] for _, importer in report["importers"]} <= \
        allowed_importers, report["importers"]


def _source_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((PROJECT_ROOT / package).rglob("*.py"))


def test_no_akadze_source_imports_or_calls_an_unsafe_loader() -> None:
    """A source scan: no import of an unsafe loader, no import of one by name, no eval/exec."""
    problems = []
    files = list(_source_files())
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text("utf-8"), str(path))
        where = str(path.relative_to(PROJECT_ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else \
                    func.attr if isinstance(func, ast.Attribute) else ""
                if called in ("eval", "exec"):
                    problems.append(f"{where}:{node.lineno}: {called}()")
                if called in ("__import__", "import_module") and node.args and \
                        isinstance(node.args[0], ast.Constant):
                    names = [str(node.args[0].value)]
                else:
                    continue
            else:
                continue
            for name in names:
                if name.split(".")[0] in UNSAFE_LOADERS:
                    problems.append(f"{where}:{node.lineno}: imports {name}")
    assert problems == [], problems


# --- passwords ---------------------------------------------------------------------------------

SECRET = "Zq9-s3cret"
MALFORMED = {
    "bad percent escape": f"postgresql://postgres:{SECRET}%zz@127.0.0.1:1/x",
    "bad port": f"postgresql://postgres:{SECRET}@127.0.0.1:notaport/x",
    "bad query": f"postgresql://postgres:{SECRET}@127.0.0.1:1/x?nosuchoption=1",
    "unterminated quote": f"host=127.0.0.1 port=1 password='{SECRET}",
    "unknown keyword": f"host=127.0.0.1 port=1 password={SECRET} nosuchoption=1",
    "unreachable": f"postgresql://postgres:{SECRET}@127.0.0.1:1/x",
}


@pytest.mark.parametrize("url", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_urls_never_leak_the_password(url: str) -> None:
    """libpq quotes pieces of a malformed DSN in its messages (a bad %-escape quotes the
    password itself): exceptions, their tracebacks and the CLI scrub it all the same."""
    app = App(url)
    for connect in (app.pool, lambda: app.run_single(lambda connection: None)):
        with pytest.raises(Exception) as raised:
            connect()
        text = "".join(traceback.format_exception(raised.value))
        assert SECRET not in text and SECRET not in repr(raised.value), text
    result = CliRunner().invoke(cli, ["stats"], env={"AKADZE_DATABASE_URL": url})
    assert result.exit_code == 1
    assert SECRET not in result.output, result.output
    one_line(result.stderr)


@pytest.mark.slow
def test_a_worker_with_a_malformed_url_says_so_without_the_password() -> None:
    url = MALFORMED["bad percent escape"]
    env = {**os.environ, "AKADZE_DATABASE_URL": url}
    result = subprocess.run([sys.executable, "-m", "akadze_core.cli", "worker",
                             "tests.integration.cli_app:app"], cwd=PROJECT_ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "percent-encoded" in line and "***" in line, line
    assert SECRET not in result.stdout + result.stderr


# --- least privilege ---------------------------------------------------------------------------

SECURITY_MD = PROJECT_ROOT / "SECURITY.md"
OWNER_PASSWORD = "Own3r-pw-91c"
RUNTIME_PASSWORD = "Runt1me-pw-4e7"


def security_block(marker: str) -> str:
    """The SQL block of SECURITY.md after ``<!-- least-privilege: {marker} -->``, with the
    example passwords replaced by this test's."""
    text = SECURITY_MD.read_text("utf-8")
    match = re.search(rf"<!-- least-privilege: {re.escape(marker)} -->\s*```sql\n(.*?)```",
                      text, re.DOTALL)
    assert match, f"SECURITY.md lost its {marker!r} block"
    return match[1].replace("change-me-owner", OWNER_PASSWORD) \
        .replace("change-me-runtime", RUNTIME_PASSWORD)


DDL = [
    "CREATE TABLE akadze.intruder (id int)",
    "ALTER TABLE akadze.jobs ADD COLUMN intruder int",
    "DROP TABLE akadze.jobs",
    "TRUNCATE akadze.jobs",
    "CREATE INDEX intruder ON akadze.jobs (task)",
    "CREATE FUNCTION akadze.intruder() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN RETURN NEW; END $$",
    "CREATE SCHEMA intruder",
    "INSERT INTO akadze.migrations (version, name) VALUES (999, 'intruder')",
    "DELETE FROM akadze.migrations",
    "UPDATE akadze.repeatable_migrations SET checksum = 'intruder'",
]


def akadze_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``akadze ARGS`` as a subprocess with ``AKADZE_DATABASE_URL=url``."""
    env = {**os.environ, "AKADZE_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "akadze_core.cli", *args], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_least_privilege_runtime_role_runs_jobs_and_cannot_migrate(
    password_cluster: PrivateCluster, spawn_worker: SpawnWorker
) -> None:
    with psycopg.connect(password_cluster.url(), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS app")
        admin.execute("CREATE DATABASE app")
    superuser_url = password_cluster.url_for("postgres", PrivateCluster.PASSWORD, "app")
    owner_url = password_cluster.url_for("akadze_owner", OWNER_PASSWORD, "app")
    runtime_url = password_cluster.url_for("akadze_runtime", RUNTIME_PASSWORD, "app")
    with psycopg.connect(superuser_url, autocommit=True) as admin:
        admin.execute(security_block("setup").encode())
        # The test's own bookkeeping (not part of the setup): the tasks record their starts.
        admin.execute(RUNS_TABLE)
        admin.execute("GRANT SELECT, INSERT ON runs TO akadze_runtime")

    migrated = akadze_cli(owner_url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "applied migrations" in migrated.stdout
    with psycopg.connect(owner_url, autocommit=True) as owner:
        owner.execute(security_block("after the first migrate").encode())
        owned = owner.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'akadze'"
                              " AND tableowner <> 'akadze_owner'").fetchone()
        assert owned == (0,)  # every akadze table belongs to the migration role

    with psycopg.connect(runtime_url, autocommit=True) as runtime:
        # DDL and the migration bookkeeping are refused to the runtime role.
        for statement in DDL:
            with pytest.raises(errors.InsufficientPrivilege):
                runtime.execute(statement)
        with pytest.raises(errors.InsufficientPrivilege):
            migrate(runtime)
        refused = akadze_cli(runtime_url, "migrate")
        assert refused.returncode == 1
        assert "permission denied" in one_line(refused.stderr)

        # Everything a worker does works with it: enqueue, claim, outcomes, rescue, prune.
        app = build_fault_app(runtime_url)
        try:
            ids = app.tasks["quick"].enqueue_many([{}] * 5)
            failing = app.tasks["flaky_sleep"].configure(max_attempts=1).enqueue(seconds=0)
            old = app.tasks["quick"].configure(delay=timedelta(days=1)).enqueue()
        finally:
            app.close()
        with psycopg.connect(owner_url, autocommit=True) as owner:
            # A job finished long ago (pruned), and one left running by a dead worker.
            owner.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                          " - interval '2 days' WHERE id = %s", (old,))
            dead = owner.execute(
                "INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl,"
                " heartbeat_at) VALUES ('dead', 'test', 0, '{default}', interval '1 second',"
                " now() - interval '1 hour') RETURNING id").fetchone()
            lost = owner.execute(
                "INSERT INTO akadze.jobs (task, queue, state, attempt, run_count, worker_id,"
                " started_at) VALUES ('quick', 'default', 'running', 1, 1, %s,"
                " now() - interval '1 hour') RETURNING id", dead).fetchone()
        assert lost is not None
        worker = spawn_worker(runtime_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl",
                              "1.5", "--poll-interval", "0.1", "--prune-interval", "0.2")

        def done() -> bool:
            rows = rows_by_id(runtime, [*ids, failing, lost[0]])
            return all(row["state"] in ("succeeded", "failed") for row in rows.values()) \
                and count(runtime, "SELECT count(*) FROM akadze.jobs WHERE id = %s",
                          (old,)) == 0

        wait_until(done, timeout=20, what="jobs to run, the lost one to be rescued, pruning")
        assert all(job(runtime, i)["state"] == "succeeded" for i in ids)
        assert error_types(job(runtime, lost[0])) == ["WorkerLost"]
        assert job(runtime, failing)["state"] == "failed"
        # The CLI's job commands work with the runtime role too.
        for command in (("jobs", "requeue", str(failing)), ("jobs", "list"), ("stats",)):
            result = akadze_cli(runtime_url, *command)
            assert result.returncode == 0, result.stderr
        wait_until(lambda: job(runtime, failing)["state"] == "succeeded",
                   what="the requeued job to run again")
        queued = build_fault_app(runtime_url)
        try:
            victim = queued.tasks["quick"].configure(delay=3600).enqueue()
        finally:
            queued.close()
        cancelled = akadze_cli(runtime_url, "jobs", "cancel", str(victim))
        assert cancelled.returncode == 0, cancelled.stderr
        assert job(runtime, victim)["state"] == "cancelled"
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()
    for output in (worker.log(), migrated.stdout + migrated.stderr,
                   refused.stdout + refused.stderr):
        for secret in (OWNER_PASSWORD, RUNTIME_PASSWORD, PrivateCluster.PASSWORD):
            assert secret not in output
