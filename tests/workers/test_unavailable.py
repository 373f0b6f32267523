"""A database that cannot take a connection now (down, or full for the app's non-superuser
role) is a retryable error, not a setting to fix: ``DatabaseUnavailable`` in the core, and on
the facade kombu's ``OperationalError`` after Celery's publish retry policy
(``task_publish_retry``, ``task_publish_retry_policy``, ``apply_async(retry=,
retry_policy=)``), which succeeds when the server comes back within it. A wrong password or
a missing database stays a ``ConfigurationError``, at once. Private clusters, real refusals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from kombu.exceptions import OperationalError as KombuOperationalError

from akadze_compat import Celery
from akadze_compat.app.publish import PLAIN_CALL
from akadze_core import ConfigurationError, DatabaseUnavailable
from tests.workers.conftest import SpawnWorker
from tests.workers.support import PrivateCluster, started_cluster
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

ROLE, ROLE_PASSWORD = "app_rw", "app-rw-pw"
#: Small enough to fill; three of them kept for superusers (Postgres's default), so the app's
#: role meets the "reserved for superusers" refusal rather than "too many clients".
MAX_CONNECTIONS = 10
NO_FREE = "the server has no free connections"
GRANTS = (
    f"CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'",
    f"GRANT USAGE ON SCHEMA akadze TO {ROLE}",
    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA akadze TO {ROLE}",
    f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA akadze TO {ROLE}",
    f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA akadze TO {ROLE}",
)


class SmallCluster(PrivateCluster):
    """A private cluster with room for only ``MAX_CONNECTIONS`` connections."""

    def _options(self) -> str:
        return (super()._options() + f" -c max_connections={MAX_CONNECTIONS}"
                " -c superuser_reserved_connections=3")


@pytest.fixture
def small() -> Iterator[SmallCluster]:
    with started_cluster(SmallCluster, *GRANTS) as server:
        yield server


def _role_url(cluster: PrivateCluster) -> str:
    return cluster.url_for(ROLE, ROLE_PASSWORD)


def fill_as_role(url: str) -> tuple[list[psycopg.Connection], str]:
    """Open connections as the non-superuser role until the server refuses; returns them
    and the refusal's text."""
    held: list[psycopg.Connection] = []
    while True:
        try:
            held.append(psycopg.connect(url, autocommit=True))
        except psycopg.OperationalError as exc:
            return held, str(exc)
        assert len(held) <= MAX_CONNECTIONS, "the server never refused"


def _celery(url: str, **conf: object) -> tuple[Celery, object]:
    celery = Celery("unavailableproj", broker=url)
    celery.conf.update(conf)
    add = celery.task(name="unavailableproj.add")(lambda x, y: x + y)
    return celery, add


def test_a_full_server_is_unavailable_not_misconfigured(
        small: SmallCluster, spawn_worker: SpawnWorker) -> None:
    url = _role_url(small)
    held, refusal = fill_as_role(url)
    try:
        # Not "too many clients": the slots left are the superusers'.
        assert "reserved" in refusal, refusal
        app = build_app(url)
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=NO_FREE) as caught:
            app.tasks["quick"].enqueue()
        assert time.monotonic() - started < 2
        assert not isinstance(caught.value, ConfigurationError)
        assert isinstance(caught.value, psycopg.OperationalError)
        assert ROLE_PASSWORD not in str(caught.value)
        app.close()
        # The worker's own line for a full server, for this role too.
        worker = spawn_worker(url, "--heartbeat-interval", "1", "--heartbeat-ttl", "10")
        worker.wait_log(NO_FREE, timeout=20)
        # Gone before slots are freed below: its retries would take them first.
        worker.stop()
        # The facade: kombu's OperationalError, after the policy's retries.
        celery, add = _celery(url)
        started = time.monotonic()
        with pytest.raises(KombuOperationalError, match=NO_FREE):
            add.apply_async((1, 2), retry_policy={"max_retries": 2, "interval_start": 0.2,
                                                  "interval_step": 0.2, "interval_max": 1})
        assert 0.5 <= time.monotonic() - started < 5  # slept 0.2 then 0.4
        # Freed within the policy: the same call succeeds.
        threading.Timer(0.8, lambda: [held.pop().close() for _ in range(2)]).start()
        result = add.apply_async((2, 3), retry_policy={"max_retries": 20, "interval_start": 0.2,
                                                       "interval_step": 0.2,
                                                       "interval_max": 0.4})
        assert result.job_id is not None
        celery.close()
    finally:
        for connection in held:
            connection.close()


def test_a_down_server_is_kombus_operational_error_after_the_retry_policy(
        small: SmallCluster) -> None:
    url = _role_url(small)
    celery, add = _celery(url)
    restarts: list[threading.Timer] = []
    small.stop()
    try:
        started = time.monotonic()
        with pytest.raises(KombuOperationalError) as caught:
            add.delay(1, 1)  # Celery's default policy: 3 retries, 0 + 0.2 + 0.4 s
        took = time.monotonic() - started
        assert isinstance(caught.value, DatabaseUnavailable)
        assert 0.5 <= took < 5, took
        assert "cannot connect to Postgres" in str(caught.value)
        started = time.monotonic()
        with pytest.raises(KombuOperationalError):
            add.apply_async((1, 1), retry=False)
        assert time.monotonic() - started < 0.5  # no retry: one attempt
        celery.conf.task_publish_retry = False
        started = time.monotonic()
        with pytest.raises(KombuOperationalError):
            add.delay(1, 1)
        assert time.monotonic() - started < 0.5
        celery.conf.task_publish_retry = True
        celery.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 1.5}
        started = time.monotonic()
        with pytest.raises(KombuOperationalError):
            add.delay(1, 1)
        assert 1.4 <= time.monotonic() - started < 5
        # Back within the policy: the call goes through, once.
        restarts.append(threading.Timer(0.5, small.start))
        restarts[-1].start()
        celery.conf.task_publish_retry_policy = {"max_retries": 60, "interval_start": 0.25,
                                                 "interval_step": 0, "interval_max": 0.25}
        result = add.delay(20, 22)
        assert result.job_id is not None
        restarts[-1].join()
        # A canvas is sent under the same policy.
        small.stop()
        restarts.append(threading.Timer(0.5, small.start))
        restarts[-1].start()
        group_result = (add.s(1, 1) | add.s(2)).apply_async()
        assert group_result.id
    finally:
        # A publish goes through as soon as the server accepts connections, which can be
        # before pg_ctl, in the timer's thread, has returned and marked it running.
        for restart in restarts:
            restart.join()
        if not small.running:
            small.start()
        celery.close()
    with psycopg.connect(small.url(), autocommit=True) as connection:
        count = connection.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    assert count == (3,)


def test_a_kept_plain_call_is_retried_under_the_policy(small: SmallCluster) -> None:
    """A plain ``delay()`` reusing its kept core call makes its first try itself; a server
    down at that try sends it on under the retry policy, as the full path does."""
    # Eight retries: the third call's window (2 s and more) must cover a server start
    # on a loaded machine.
    policy = {"max_retries": 8, "interval_start": 0.25, "interval_step": 0,
              "interval_max": 0.25}
    celery, add = _celery(_role_url(small), task_publish_retry_policy=policy)
    restart = threading.Timer(0.4, small.start)
    try:
        add.delay(1, 1)  # the full path, which keeps the call
        assert PLAIN_CALL in add.__dict__  # type: ignore[operator]
        small.stop()
        started = time.monotonic()
        with pytest.raises(KombuOperationalError):
            add.delay(2, 2)
        # Eight retries 0.25 s apart, each try also waiting out the reconnect window of
        # the app's connection found dead.
        assert time.monotonic() - started >= 2.0
        restart.start()
        result = add.delay(3, 3)
        assert result.job_id is not None and PLAIN_CALL in add.__dict__  # type: ignore[operator]
    finally:
        if restart.is_alive():
            restart.join()  # a start under way: a second one would fail
        if not small.running:
            small.start()
        celery.close()
    with psycopg.connect(small.url(), autocommit=True) as connection:
        rows = connection.execute("SELECT args FROM akadze.jobs ORDER BY id").fetchall()
    assert [row[0]["args"] for row in rows] == [[1, 1], [3, 3]]


def test_wrong_settings_stay_a_configuration_error_at_once(small: SmallCluster) -> None:
    for url in (small.url_for(ROLE, ROLE_PASSWORD, database="nope"),
                small.url_for("no_such_role", "x")):
        celery, add = _celery(url)
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as caught:
            add.delay(1, 1)
        assert time.monotonic() - started < 1
        assert not isinstance(caught.value, KombuOperationalError | DatabaseUnavailable)
        celery.close()
