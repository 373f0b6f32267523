"""Remote control in the core (``akadze_core.ops.control.broadcast``) answered by worker processes:
every live worker replies once, queues added and removed at runtime change what a worker
claims, a lost NOTIFY is made up for by the heartbeat, a killed worker never answers, and
a shutdown stops the worker without a reply."""

from __future__ import annotations

import time

import psycopg

from akadze_core.ops.control import broadcast
from tests.workers.conftest import SpawnWorker
from tests.workers.support import wait_until
from tests.workers.worker_app import build_app


def _names(replies: list) -> list[str]:
    return sorted(reply.worker for reply in replies)


def test_every_live_worker_answers_once(runs_db: psycopg.Connection, database_url: str,
                                        spawn_worker: SpawnWorker) -> None:
    first = spawn_worker(database_url, "--queue", "a")
    second = spawn_worker(database_url, "--queue", "b")
    first.wait_started()
    second.wait_started()
    app = build_app(database_url)
    replies = broadcast(app, "ping", reply=True, timeout=5.0)
    assert [reply.reply for reply in replies] == ["pong", "pong"]
    assert len({reply.worker_id for reply in replies}) == 2
    assert broadcast(app, "ping") == []  # reply=False: nothing to wait for

    def handled() -> bool:
        # Each worker marks the request handled (a NULL reply), so it never runs it twice.
        row = runs_db.execute("SELECT count(*) FILTER (WHERE reply IS NULL), count(*)"
                              " FROM akadze.control_replies").fetchone()
        runs_db.commit()
        return row == (2, 4)

    wait_until(handled, timeout=5.0, what="both workers handling the reply=False ping")
    only = broadcast(app, "queues", reply=True, destination=[replies[0].worker])
    assert len(only) == 1 and only[0].reply in (["a"], ["b"])


def test_add_and_remove_queue_change_what_the_worker_claims(runs_db: psycopg.Connection,
                                                            database_url: str,
                                                            spawn_worker: SpawnWorker) -> None:
    worker = spawn_worker(database_url, "--queue", "a")
    worker.wait_started()
    app = build_app(database_url)
    job = app.tasks["quick"].configure(queue="extra").enqueue()
    time.sleep(0.5)
    assert app.get_job(job).state == "queued"
    assert [reply.reply for reply in broadcast(app, "add_queue", {"queue": "extra"},
                                               reply=True)] == [["a", "extra"]]
    assert app.wait_for_job(job, timeout=10).state == "succeeded"
    assert app.list_workers(live=True)[0]["queues"] == ["a", "extra"]
    assert [reply.reply for reply in broadcast(app, "remove_queue", {"queue": "extra"},
                                               reply=True)] == [["a"]]
    later = app.tasks["quick"].configure(queue="extra").enqueue()
    time.sleep(1.0)
    assert app.get_job(later).state == "queued"


def test_a_request_whose_notify_was_missed_is_answered_at_the_next_heartbeat(
        runs_db: psycopg.Connection, database_url: str, spawn_worker: SpawnWorker) -> None:
    worker = spawn_worker(database_url, "--queue", "a", "--heartbeat-interval", "0.5",
                          "--heartbeat-ttl", "3")
    worker.wait_started()
    (worker_id,) = runs_db.execute("SELECT id FROM akadze.workers").fetchone()
    # Written without the NOTIFY control_send sends: only the heartbeat can find it.
    (request_id,) = runs_db.execute(
        "INSERT INTO akadze.control_requests (command, targets, reply, expires_at)"
        " VALUES ('ping', ARRAY[%s]::bigint[], true, now() + interval '1 minute')"
        " RETURNING id", (worker_id,)).fetchone()
    runs_db.commit()
    started = time.monotonic()

    def answered() -> bool:
        row = runs_db.execute("SELECT reply FROM akadze.control_replies WHERE request_id = %s",
                              (request_id,)).fetchone()
        runs_db.commit()
        return row is not None and row[0] == "pong"

    assert wait_until(answered, timeout=5.0, what="the heartbeat's answer") - started < 2.0


def test_a_killed_worker_never_answers(runs_db: psycopg.Connection, database_url: str,
                                       spawn_worker: SpawnWorker) -> None:
    alive = spawn_worker(database_url, "--queue", "a")
    doomed = spawn_worker(database_url, "--queue", "a")
    alive.wait_started()
    doomed.wait_started()
    app = build_app(database_url)
    doomed.proc.kill()
    doomed.wait_exit()
    started = time.monotonic()
    replies = broadcast(app, "ping", reply=True, timeout=1.0)
    assert time.monotonic() - started >= 0.9  # asked (its heartbeat is fresh), never answered
    assert len(replies) == 1
    wait_until(lambda: len(app.list_workers(live=True)) == 1, timeout=10.0)
    started = time.monotonic()
    assert len(broadcast(app, "ping", reply=True, timeout=5.0)) == 1
    assert time.monotonic() - started < 2.0


def test_shutdown_stops_the_worker_without_a_reply(runs_db: psycopg.Connection,
                                                   database_url: str,
                                                   spawn_worker: SpawnWorker) -> None:
    app = build_app(database_url)
    worker = spawn_worker(database_url, "--queue", "a")
    worker.wait_started()
    started = time.monotonic()
    assert broadcast(app, "shutdown", reply=True, timeout=5.0) == []
    assert time.monotonic() - started < 3.0  # handled (a NULL reply): not waited for
    code, _ = worker.wait_exit()
    assert code == 0 and "asked to by a remote-control shutdown" in worker.log()


def test_pool_grow_on_a_worker_without_a_threads_limit_says_why_not(
        runs_db: psycopg.Connection, database_url: str, spawn_worker: SpawnWorker) -> None:
    # `akadze worker` runs async bodies without a limit of threads: nothing to resize (the
    # dashboard shows the reason; akadze-compat's threads pool answers with Celery's reply).
    worker = spawn_worker(database_url, "--queue", "a")
    worker.wait_started()
    app = build_app(database_url)
    for command in ("pool_grow", "pool_shrink"):
        replies = broadcast(app, command, {"n": 1}, reply=True, timeout=5.0)
        assert [reply.reply for reply in replies] == [
            {"error": "this worker's pool cannot be resized (only a threads pool can)"}]
