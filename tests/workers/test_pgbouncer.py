"""Through PgBouncer in transaction mode (Debian's pgbouncer, 1.18: no prepared statements
across transactions), in front of a private cluster: the engine and the facade work with
``AKADZE_PREPARE_THRESHOLD=off``, and without it a worker stops with the one line that says
so instead of failing claim after claim.

PgBouncer runs with ``server_round_robin = 1`` and ``DISCARD ALL`` after every transaction,
so a statement prepared in one transaction is gone in the next for certain (a client alone
otherwise keeps getting the same server connection, which would hide the loss).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_compat import Celery
from akadze_core import App, request_cancel_sync
from tests.workers.support import (
    PrivateCluster,
    WorkerProcess,
    free_port,
    started_cluster,
    wait_until,
)

pytestmark = pytest.mark.slow

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
APP = "tests.integration.cli_app:app"


class PgBouncer:
    """A pgbouncer of the test's own, in transaction mode, on a free port."""

    def __init__(self, cluster: PrivateCluster, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        directory.mkdir()
        (directory / "users.txt").write_text('"postgres" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={cluster.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
            "pool_mode = transaction\nserver_round_robin = 1\n"
            # DISCARD ALL after every transaction: the session state a client left on a server
            # connection is gone before the next transaction, whoever runs it, so a prepared
            # statement is lost for certain (a lone client otherwise keeps its server).
            "server_reset_query = DISCARD ALL\nserver_reset_query_always = 1\n"
            "default_pool_size = 4\nmax_client_conn = 200\n"
            # psycopg sends none of these, but a driver that does must not be refused.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {directory / 'pgbouncer.log'}\n")
        if cluster.user:  # as root, pgbouncer refuses to run: it runs as postgres, like the server
            shutil.chown(directory, cluster.user)
            for path in directory.iterdir():
                shutil.chown(path, cluster.user)
        self.process = subprocess.Popen([PGBOUNCER, str(directory / "pgbouncer.ini")],
                                        user=cluster.user, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        url = self.url("postgres")
        wait_until(lambda: _accepts(url), 15, "pgbouncer to accept connections")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _accepts(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    if not os.path.exists(PGBOUNCER):
        pytest.skip("no pgbouncer (apt-get install pgbouncer; .ci/run installs it)")
    with started_cluster() as server:
        yield server


@pytest.fixture(scope="module")
def bouncer(cluster: PrivateCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[PgBouncer]:
    # Not under pytest's own (private) temporary root: pgbouncer runs as another user.
    root = Path(tempfile.mkdtemp(prefix="akadze-pgbouncer-"))
    root.chmod(0o755)
    pooler = PgBouncer(cluster, root / "pgbouncer")
    yield pooler
    pooler.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def direct(cluster: PrivateCluster) -> Iterator[psycopg.Connection]:
    """A direct connection for the assertions, with an empty jobs table."""
    with psycopg.connect(cluster.url(), autocommit=True) as connection:
        connection.execute("TRUNCATE akadze.jobs")
        yield connection


def states(direct: psycopg.Connection) -> dict[str, int]:
    return dict(direct.execute(
        "SELECT state, count(*) FROM akadze.jobs GROUP BY state").fetchall())  # type: ignore[arg-type]


def test_the_engine_through_pgbouncer_with_prepared_statements_off(
        bouncer: PgBouncer, direct: psycopg.Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AKADZE_PREPARE_THRESHOLD", "off")
    url = bouncer.url("postgres")
    app = App(url)
    add = app.task("cli.add")(lambda a, b: a + b)
    app.task("cli.block")(lambda seconds: None)
    # Many more than five of each statement, so that psycopg would have prepared them.
    singles = [add.enqueue(a=n, b=1) for n in range(40)]
    bulk = add.enqueue_many([{"a": n, "b": 2} for n in range(300)])
    asyncio.run(_enqueue_async(app))
    doomed = app.tasks["cli.block"].configure(delay=3600).enqueue(seconds=0)
    with app.connect(autocommit=True) as connection:  # cancellation through the pooler
        assert request_cancel_sync(connection, doomed) is True
    worker = WorkerProcess(url, tmp_path / "worker.log",
                           ["worker", APP, "--slots", "8", "--poll-interval", "0.2"],
                           module="akadze_core.cli.main", env={"AKADZE_PREPARE_THRESHOLD": "off"})
    try:
        worker.wait_started()
        wait_until(lambda: states(direct).get("succeeded") == 360, 60, "every job to succeed")
        assert app.wait_for_job(singles[0], timeout=10).result == 1
        assert app.get_job(bulk[-1]).result == 301  # type: ignore[union-attr]
        assert states(direct) == {"succeeded": 360, "cancelled": 1}
        assert "prepared statement" not in worker.log()
    finally:
        worker.stop()
        app.close()


async def _enqueue_async(app: App) -> None:
    add = app.tasks["cli.add"]
    for n in range(10):
        await add.enqueue_async(a=n, b=3)
    await add.enqueue_many_async([{"a": n, "b": 4} for n in range(10)])
    await app.close_async()


@pytest.mark.parametrize("setting", ["off", ""])
def test_the_facade_through_pgbouncer_with_prepared_statements_off(
        bouncer: PgBouncer, direct: psycopg.Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    """Said up front (``off``) or not at all (``""``: the first lost prepared statement
    switches each process to unprepared statements), every task runs."""
    monkeypatch.setenv("AKADZE_PREPARE_THRESHOLD", setting)
    (tmp_path / "bouncedproj.py").write_text(
        "from akadze_compat import Celery\n"
        "app = Celery('bouncedproj')\n"
        "@app.task\n"
        "def mul(x, y):\n"
        "    return x * y\n")
    env = {**os.environ, "AKADZE_DATABASE_URL": bouncer.url("postgres"),
           "AKADZE_PREPARE_THRESHOLD": setting, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path.cwd())])}
    log = (tmp_path / "compat.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "akadze_compat", "-A", "bouncedproj",
                               "worker", "-P", "threads", "-c", "4"], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        celery = Celery("bouncedproj", broker=bouncer.url("postgres"))
        mul = celery.task(name="bouncedproj.mul")(lambda x, y: x * y)
        results = [mul.delay(n, 2) for n in range(30)]
        assert [result.get(timeout=30) for result in results] == [n * 2 for n in range(30)]
        assert celery.send_task("bouncedproj.mul", (6, 7)).get(timeout=30) == 42
        results = [mul.delay(n, 3) for n in range(60)]
        assert [result.get(timeout=30) for result in results] == [n * 3 for n in range(60)]
        celery.close()
        assert worker.poll() is None
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
    text = (tmp_path / "compat.log").read_text()
    if setting == "off":
        assert "prepared statement" not in text
    # The switch leaves WARNING lines (psycopg's about the aborted pipeline among them);
    # no error, no traceback.
    assert "ERROR" not in text and "Traceback" not in text, text


def test_without_the_setting_a_lost_prepared_statement_is_detected_and_run_unprepared(
        bouncer: PgBouncer, direct: psycopg.Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody said PgBouncer: the first lost prepared statement (an error of Parse or Bind,
    so nothing ran) turns preparing off for the process, with one WARNING, and the statement
    runs again unprepared; every job is enqueued once. (The worker is told: see the next
    test.)"""
    monkeypatch.delenv("AKADZE_PREPARE_THRESHOLD", raising=False)
    url = bouncer.url("postgres")
    app = App(url)
    add = app.task("cli.add")(lambda a, b: a + b)
    assert app.prepare_threshold == 5
    ids = [add.enqueue(a=n, b=1) for n in range(40)]
    ids += add.enqueue_many([{"a": n, "b": 2} for n in range(50)])
    assert app.prepare_threshold is None
    lost = [r for r in caplog.records if "prepared statement was lost" in r.getMessage()]
    assert len(lost) == 1, caplog.text
    assert len(set(ids)) == 90 and states(direct) == {"queued": 90}  # each exactly once
    worker = WorkerProcess(url, tmp_path / "worker.log",
                           ["worker", APP, "--slots", "4", "--poll-interval", "0.05"],
                           module="akadze_core.cli.main", env={"AKADZE_PREPARE_THRESHOLD": "off"})
    try:
        wait_until(lambda: states(direct).get("succeeded") == 90, 60, "every job to succeed")
    finally:
        worker.stop()
        app.close()
    assert "error" not in worker.log().lower(), worker.log()


def test_without_the_setting_a_worker_and_a_producer_switch_to_unprepared_and_go_on(
        bouncer: PgBouncer, direct: psycopg.Connection, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody said PgBouncer, to the worker or to the producer: the worker's first lost
    prepared statement (its claims, heartbeats and outcome writes run many times each, so
    psycopg prepares them) switches the worker to unprepared statements and the failed step
    is retried. It keeps running, every job succeeds, none is left running."""
    monkeypatch.delenv("AKADZE_PREPARE_THRESHOLD", raising=False)
    url = bouncer.url("postgres")
    worker = WorkerProcess(url, tmp_path / "worker.log",
                           ["worker", APP, "--slots", "4", "--poll-interval", "0.05"],
                           module="akadze_core.cli.main", env={"AKADZE_PREPARE_THRESHOLD": ""})
    app = App(url)
    add = app.task("cli.add")(lambda a, b: a + b)
    try:
        worker.wait_started()
        # In rounds, so that the worker claims, heartbeats and writes outcomes many times.
        for round_ in range(10):
            for n in range(20):
                add.enqueue(a=round_, b=n)
            time.sleep(0.1)
        ids = add.enqueue_many([{"a": n, "b": 0} for n in range(100)])
        wait_until(lambda: states(direct).get("succeeded") == 300, 90,
                   "every job to succeed")
        assert app.get_job(ids[-1]).result == 99  # type: ignore[union-attr]
        time.sleep(1.0)
        assert worker.proc.poll() is None, worker.log()
        assert states(direct) == {"succeeded": 300}
    finally:
        worker.stop()
        app.close()
    log = worker.log()
    assert "this process stops preparing statements" in log, log
    assert log.count("this process stops preparing statements") == 1, log
    assert "akadze: error" not in log, log


def test_a_direct_listen_url_wakes_a_worker_whose_queries_go_through_pgbouncer(
        bouncer: PgBouncer, cluster: PrivateCluster, direct: psycopg.Connection,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LISTEN needs a session of its own, which a transaction pooler does not keep: with
    AKADZE_LISTEN_URL the worker listens on a direct connection, so an enqueue made through
    the pooler still wakes it at once instead of at its next poll (10 s here)."""
    monkeypatch.setenv("AKADZE_PREPARE_THRESHOLD", "off")
    url = bouncer.url("postgres")
    worker = WorkerProcess(url, tmp_path / "worker.log",
                           ["worker", APP, "--poll-interval", "10"], module="akadze_core.cli.main",
                           env={"AKADZE_PREPARE_THRESHOLD": "off",
                                "AKADZE_LISTEN_URL": cluster.url()})
    app = App(url)
    add = app.task("cli.add")(lambda a, b: a + b)
    try:
        worker.wait_started()
        time.sleep(1.0)  # past the first claim round: the worker is idle, polling every 10 s
        enqueued = time.monotonic()
        job_id = add.enqueue(a=2, b=3)
        # Watched on the direct connection (a wait_for_job through the pooler would itself
        # depend on LISTEN).
        done = wait_until(lambda: direct.execute(
            "SELECT state FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone() == (
                "succeeded",), 12, "the job to succeed")
        assert done - enqueued < 3, "woken by NOTIFY, not by the 10 s poll"
        # The client's own wait LISTENs on the direct URL too: no 5 s re-check needed.
        monkeypatch.setenv("AKADZE_LISTEN_URL", cluster.url())
        time.sleep(1.0)
        waited = time.monotonic()
        assert app.wait_for_job(add.enqueue(a=4, b=4), timeout=8).result == 8
        assert time.monotonic() - waited < 3
    finally:
        worker.stop()
        app.close()
