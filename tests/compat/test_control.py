"""``app.control`` and ``inspect()`` answered by real worker processes.

Two ``akadze-compat worker`` processes (``c1`` on queue ``ca`` with one thread, ``c2`` on
``cb`` with two) run a project written here, with its own ``control_command`` and
``inspect_command``; the test process asks through ``app.control`` (a plain client app on
the same database) and through the ``akadze-compat inspect/control/status`` commands.
"""

from __future__ import annotations

import json
import signal
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from akadze_compat import Celery
from tests.compat.cli_harness import CompatWorker, run, wait_until
from tests.compat.conftest import SpawnCompat

# Real worker processes (and a Celery worker): the first CI pass runs them.
pytestmark = pytest.mark.slow

HOST = socket.gethostname()
C1, C2 = f"c1@{HOST}", f"c2@{HOST}"
#: Short heartbeats: a killed worker is judged dead within about a second and a half.
TIMINGS = {"AKADZE_HEARTBEAT_INTERVAL": "0.3", "AKADZE_HEARTBEAT_TTL": "1.5"}

PROJECT = '''
import time

from akadze_compat import Celery
from akadze_compat.worker.control import control_command, inspect_command

app = Celery("ctlapp")


@app.task(name="ctlapp.nap")
def nap(seconds):
    time.sleep(seconds)
    return seconds


@app.task(name="ctlapp.mark")
def mark(tag):
    return tag


@control_command(args=[("tag", str)], signature="<tag>")
def remember(state, tag):
    """Remember a tag in this worker."""
    state.consumer.controller.remembered = tag
    return {"ok": f"remembered {tag}"}


@control_command()
def explode(state):
    """Fail."""
    raise ValueError("boom")


@inspect_command()
def recall(state):
    """Say which tag this worker remembers."""
    return {"tag": getattr(state.consumer.controller, "remembered", None),
            "node": state.hostname}
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's directory (the workers' and the commands' working directory)."""
    directory = tmp_path_factory.mktemp("ctlapp")
    (directory / "ctlapp.py").write_text(textwrap.dedent(PROJECT), "utf-8")
    return directory


def _start(spawn: SpawnCompat, url: str, project: Path, node: str, queue: str,
           concurrency: int) -> CompatWorker:
    worker = spawn("-b", url, "-A", "ctlapp", "worker", "-P", "threads", "-c", str(concurrency),
                   "-n", node, "-Q", queue, "-l", "INFO", cwd=project, env=TIMINGS)
    worker.wait_ready()
    return worker


@pytest.fixture(scope="module")
def workers(module_database_url: str, module_spawn_compat: SpawnCompat,
            project: Path) -> dict[str, CompatWorker]:
    return {C1: _start(module_spawn_compat, module_database_url, project, "c1@%h", "ca", 1),
            C2: _start(module_spawn_compat, module_database_url, project, "c2@%h", "cb", 2)}


@pytest.fixture(scope="module")
def app(module_database_url: str, workers: dict[str, CompatWorker]) -> Iterator[Celery]:
    """A client app: it knows no tasks, only the database."""
    client = Celery("client", broker=module_database_url)
    yield client
    client.close()


def _nodes(replies: list[dict[str, Any]]) -> list[str]:
    return sorted(node for reply in replies for node in reply)


# --- reaching the workers ----------------------------------------------------------------------

def test_ping_returns_as_soon_as_every_live_worker_answered(app: Celery) -> None:
    started = time.monotonic()
    replies = app.control.ping(timeout=5.0)
    assert time.monotonic() - started < 3.0  # not the 5 s timeout: both answered
    assert sorted(replies, key=lambda reply: next(iter(reply))) == [
        {C1: {"ok": "pong"}}, {C2: {"ok": "pong"}}]
    assert app.control.inspect().ping() == {C1: {"ok": "pong"}, C2: {"ok": "pong"}}


def test_destination_pattern_and_limit_choose_who_answers(app: Celery) -> None:
    assert app.control.ping(destination=[C1]) == [{C1: {"ok": "pong"}}]
    assert app.control.inspect(destination=[C2]).ping() == {C2: {"ok": "pong"}}
    assert app.control.inspect(destination=["nobody@nowhere"], timeout=0.3).ping() is None
    assert _nodes(app.control.broadcast("ping", reply=True, pattern="c2@*",
                                        matcher="glob")) == [C2]
    assert _nodes(app.control.broadcast("ping", reply=True, pattern=r"^c1@",
                                        matcher="pcre")) == [C1]
    assert len(app.control.broadcast("ping", reply=True, limit=1)) == 1
    seen: list[dict[str, Any]] = []
    app.control.ping(callback=seen.append)
    assert _nodes(seen) == [C1, C2]
    with pytest.raises(ValueError, match="destination must be a list/tuple"):
        app.control.broadcast("ping", destination=C1)


def test_inspect_replies_are_per_worker_in_celerys_shapes(app: Celery,
                                                          workers: dict[str, CompatWorker]
                                                          ) -> None:
    inspect = app.control.inspect()
    stats = inspect.stats()
    assert set(stats) == {C1, C2}
    for node, worker in workers.items():
        assert set(stats[node]) == {"total", "pid", "clock", "uptime", "pool", "broker",
                                    "prefetch_count", "rusage"}
        assert stats[node]["pid"] == worker.pid
        assert stats[node]["broker"]["transport"] == "postgresql"
    assert stats[C1]["pool"]["max-concurrency"] == 1
    assert stats[C2]["pool"]["max-concurrency"] == 2
    assert inspect.registered() == {C1: ["ctlapp.mark", "ctlapp.nap"],
                                    C2: ["ctlapp.mark", "ctlapp.nap"]}
    queues = inspect.active_queues()
    assert {node: [queue["name"] for queue in found] for node, found in queues.items()} == \
        {C1: ["ca"], C2: ["cb"]}
    assert queues[C1][0]["exchange"]["type"] == "direct"
    conf = inspect.conf()
    assert set(conf) == {C1, C2} and isinstance(conf[C1], dict)
    assert all(isinstance(found, list) for found in inspect.revoked().values())


def test_active_reserved_and_query_task_come_from_the_worker_holding_them(app: Celery) -> None:
    running = app.send_task("ctlapp.nap", args=(6,), queue="ca")
    waiting = app.send_task("ctlapp.nap", args=(0.1,), queue="ca")  # c1 has one thread

    def held() -> Any:
        active, reserved = app.control.inspect().active(), app.control.inspect().reserved()
        ok = [r["id"] for r in active[C1]] == [running.id] and \
            [r["id"] for r in reserved[C1]] == [waiting.id]
        return (active, reserved) if ok else None

    active, reserved = wait_until(held, timeout=20)
    assert active[C2] == [] and reserved[C2] == []
    entry = active[C1][0]
    assert entry["name"] == "ctlapp.nap" and entry["args"] == [6]
    assert entry["hostname"] == C1 and entry["acknowledged"] is True
    assert entry["delivery_info"]["routing_key"] == "ca"
    assert reserved[C1][0]["acknowledged"] is False and reserved[C1][0]["time_start"] is None
    found = app.control.inspect().query_task(running.id, waiting.id)
    assert found[C2] == {}
    assert found[C1][running.id][0] == "active" and found[C1][waiting.id][0] == "reserved"
    assert found[C1][running.id][1]["id"] == running.id
    assert running.get(timeout=20) == 6 and waiting.get(timeout=20) == 0.1


def test_scheduled_lists_each_eta_task_once_and_revoked_the_revoke(app: Celery) -> None:
    later = app.send_task("ctlapp.mark", args=("later",), queue="ca", countdown=300)
    scheduled = app.control.inspect().scheduled()
    assert [item["request"]["id"] for item in scheduled[C1]] == [later.id]
    assert scheduled[C2] == []  # it does not consume ca
    assert scheduled[C1][0]["eta"] and scheduled[C1][0]["request"]["args"] == ["later"]
    app.control.revoke(later.id)
    revoked = app.control.inspect().revoked()
    assert later.id in revoked[C1] and later.id in revoked[C2]
    assert app.control.inspect().scheduled() == {C1: [], C2: []}


def test_add_and_cancel_consumer_change_what_the_worker_claims(app: Celery) -> None:
    first = app.send_task("ctlapp.mark", args=("first",), queue="cnew")
    time.sleep(1.0)
    assert first.state == "PENDING"  # nobody consumes cnew yet
    assert app.control.add_consumer("cnew", destination=[C2], reply=True) == [
        {C2: {"ok": "add consumer cnew"}}]
    assert first.get(timeout=15) == "first"
    queues = app.control.inspect().active_queues()
    assert [queue["name"] for queue in queues[C2]] == ["cb", "cnew"]
    assert [queue["name"] for queue in queues[C1]] == ["ca"]
    # The workers table says so too (akadze-compat status, other workers' views).
    assert {row["name"]: row["queues"] for row in app.core.list_workers(live=True)}[C2] == \
        ["cb", "cnew"]
    assert app.control.cancel_consumer("cnew", destination=[C2], reply=True) == [
        {C2: {"ok": "no longer consuming from cnew"}}]
    second = app.send_task("ctlapp.mark", args=("second",), queue="cnew")
    time.sleep(1.5)
    assert second.state == "PENDING"
    assert [queue["name"] for queue in app.control.inspect().active_queues()[C2]] == ["cb"]
    app.control.revoke(second.id)


def test_a_projects_own_commands_are_answered(app: Celery) -> None:
    assert app.control.broadcast("remember", arguments={"tag": "t1"}, destination=[C1],
                                 reply=True) == [{C1: {"ok": "remembered t1"}}]
    assert app.control.inspect()._request("recall") == {
        C1: {"tag": "t1", "node": C1}, C2: {"tag": None, "node": C2}}
    assert app.control.broadcast("explode", reply=True, destination=[C1]) == [
        {C1: {"error": "ValueError('boom')"}}]
    assert app.control.broadcast("no_such_command", reply=True, destination=[C1]) == [
        {C1: {"error": "KeyError('no_such_command')"}}]


def test_pool_grow_and_shrink_change_the_threads_pool(app: Celery) -> None:
    assert app.control.pool_grow(2, destination=[C2], reply=True) == [
        {C2: {"ok": "pool will grow"}}]
    stats = app.control.inspect(destination=[C2]).stats()[C2]
    assert stats["pool"]["max-concurrency"] == 4
    assert app.control.pool_shrink(2, destination=[C2], reply=True) == [
        {C2: {"ok": "pool will shrink"}}]
    assert app.control.inspect(destination=[C2]).stats()[C2]["pool"]["max-concurrency"] == 2


def test_time_limit_and_rate_limit_replies(app: Celery) -> None:
    assert app.control.time_limit("ctlapp.nap", soft=5, hard=10, destination=[C1],
                                  reply=True) == [{C1: {"ok": "time limits set successfully"}}]
    assert app.control.time_limit("ctlapp.nope", soft=1, destination=[C1], reply=True) == [
        {C1: {"error": "unknown task"}}]
    reply = app.control.rate_limit("ctlapp.mark", "10/m", destination=[C1], reply=True)
    assert reply == [{C1: {"ok": "new rate limit set successfully"}}]
    # Global: set in the database, for every worker.
    assert app.core.rate_limits() == [
        {"kind": "task", "name": "ctlapp.mark", "rate": 10, "period": 60.0}]
    bad = app.control.rate_limit("ctlapp.mark", "ten", destination=[C1], reply=True)
    assert bad[0][C1]["error"].startswith("Invalid rate limit string")
    assert app.control.inspect(destination=[C1]).registered("rate_limit") == {
        C1: ["ctlapp.mark [rate_limit=10/m]", "ctlapp.nap"]}
    app.control.rate_limit("ctlapp.mark", None, destination=[C1], reply=True)
    assert app.core.rate_limits() == []


# --- workers that die or are told to stop --------------------------------------------------------

def test_a_killed_worker_never_answers(app: Celery, module_database_url: str,
                                       spawn_compat: SpawnCompat, project: Path) -> None:
    doomed = _start(spawn_compat, module_database_url, project, "c3@%h", "cz", 1)
    assert f"c3@{HOST}" in _nodes(app.control.ping())
    doomed.terminate(signal.SIGKILL)
    doomed.wait_exit()
    started = time.monotonic()
    replies = app.control.ping(timeout=1.0)
    # Its heartbeat is still fresh: it is asked, never answers, and the call waits for it.
    assert time.monotonic() - started >= 0.9
    assert _nodes(replies) == [C1, C2]
    wait_until(lambda: f"c3@{HOST}" not in {row["name"]
                                             for row in app.core.list_workers(live=True)})
    started = time.monotonic()
    assert _nodes(app.control.ping(timeout=5.0)) == [C1, C2]
    assert time.monotonic() - started < 3.0  # judged dead: no longer waited for


def test_shutdown_stops_the_worker_without_a_reply(app: Celery, module_database_url: str,
                                                   spawn_compat: SpawnCompat,
                                                   project: Path) -> None:
    leaving = _start(spawn_compat, module_database_url, project, "c4@%h", "cz", 1)
    assert app.control.broadcast("shutdown", destination=[f"c4@{HOST}"], reply=True,
                                 timeout=2.0) == []
    assert leaving.wait_exit(20) == 0
    assert "Got shutdown from remote" in leaving.log()
    assert _nodes(app.control.ping()) == [C1, C2]


# --- the commands -------------------------------------------------------------------------------

def cli(url: str, project: Path, *args: str) -> tuple[int, str, str]:
    done = run("-b", url, "-A", "ctlapp", *args, cwd=project)
    return done.returncode, done.stdout, done.stderr


def test_inspect_control_and_status_commands(module_database_url: str, project: Path,
                                             workers: dict[str, CompatWorker]) -> None:
    url = module_database_url
    code, out, _ = cli(url, project, "status")
    assert code == 0 and f"->  {C1}: OK" in out and "2 nodes online." in out
    code, out, _ = cli(url, project, "inspect", "ping", "-j")
    assert code == 0 and json.loads(out) == {C1: {"ok": "pong"}, C2: {"ok": "pong"}}
    code, out, _ = cli(url, project, "inspect", "registered", "-d", C1)
    assert code == 0 and f"->  {C1}: OK" in out and "* ctlapp.nap" in out
    assert "1 node online." in out
    code, out, _ = cli(url, project, "control", "remember", "t2", "-d", C2)
    assert code == 0 and f"->  {C2}: OK" in out and "remembered t2" in out
    code, out, _ = cli(url, project, "inspect", "recall", "-j")
    assert json.loads(out)[C2] == {"tag": "t2", "node": C2}
    code, out, _ = cli(url, project, "control", "add_consumer", "clinew", "-d", C1, "-j")
    assert code == 0 and json.loads(out) == [{C1: {"ok": "add consumer clinew"}}]
    code, out, _ = cli(url, project, "control", "cancel_consumer", "clinew", "-d", C1)
    assert code == 0 and "no longer consuming from clinew" in out
    code, out, _ = cli(url, project, "inspect", "query_task", "nonexistent", "-j")
    assert code == 0 and json.loads(out) == {C1: {}, C2: {}}
    code, _, err = cli(url, project, "inspect", "ping", "-d", "nobody@nowhere", "-t", "0.3")
    assert code == 69 and "No nodes replied within time constraint" in err
    code, _, err = cli(url, project, "control", "nonsense")
    assert code == 2 and "Command nonsense not recognized" in err and "remember" in err
