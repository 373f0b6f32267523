"""Remote control under Celery 5.7 (Redis) or akadze_compat (Postgres): one worker, then every
``inspect`` / ``control`` call, recorded as the replies' shapes.

``python control_probe.py celery|akadze_compat BROKER_URL OUT.json`` writes a small project
(two tasks, a custom ``control_command`` and ``inspect_command``), starts its worker
(``-P threads -c 1 -n ctl@probe -Q q1``), puts one task running, one reserved behind it and
one waiting for its eta, asks, and writes ``{call: reply}`` and ``{call: shape}`` to OUT.
Run by ``test_control_differential.py`` under each interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODE = "ctl@probe"

PROJECT = '''
import os
import time

from {package} import Celery
from {package}.worker.control import control_command, inspect_command

app = Celery("ctlproj", broker=os.environ["CTL_BROKER"])
app.conf.worker_hijack_root_logger = False


@app.task(name="ctlproj.nap")
def nap(seconds):
    time.sleep(seconds)
    return seconds


@app.task(name="ctlproj.add")
def add(x, y):
    return x + y


@control_command(args=[("n", int)], signature="[N=1]")
def bump(state, n=1):
    """Bump a counter (a custom control command)."""
    return {{"ok": f"bumped by {{n}}", "node": state.hostname}}


@inspect_command()
def where(state):
    """Say where this worker is (a custom inspect command)."""
    return {{"node": state.hostname, "app": state.app.main}}
'''


def shape(value: Any) -> Any:
    """The JSON types of ``value``, keys kept: what a differential test compares."""
    if isinstance(value, dict):
        return {str(key): shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    return type(value).__name__


def main() -> None:
    side, broker, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    # Beside OUT (the test's tmp_path), so nothing is left behind elsewhere.
    directory = Path(tempfile.mkdtemp(prefix=f"ctl-{side}-", dir=out.resolve().parent))
    package = "celery" if side == "celery" else "akadze_compat"
    (directory / "ctlproj.py").write_text(PROJECT.format(package=package), "utf-8")
    sys.path.insert(0, str(directory))
    os.environ["CTL_BROKER"] = broker
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "AKADZE_POLL_INTERVAL": "0.1", "PYTHONUNBUFFERED": "1"}
    module = "celery" if side == "celery" else "akadze_compat"
    if side == "celery":
        import redis  # Celery's side only: start from an empty broker database

        redis.Redis.from_url(broker).flushdb()
    else:
        subprocess.run([sys.executable, "-m", module, "-A", "ctlproj", "migrate"], cwd=directory,
                       env=env, check=True, capture_output=True)
    log = open(directory / "worker.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [sys.executable, "-m", module, "-A", "ctlproj", "worker", "-P", "threads", "-c", "1",
         "-n", NODE, "-Q", "q1", "-l", "INFO", "--without-heartbeat", "--without-mingle",
         "--without-gossip"], cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        replies = probe(side)
    finally:
        if worker.poll() is None:
            worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
    replies["worker exited after shutdown"] = worker.returncode is not None
    # The task id is a key there: one name for it, so both sides' shapes compare.
    replies["inspect.query_task"] = {
        node: dict.fromkeys(["<task id>"] if found else [], next(iter(found.values()), None))
        for node, found in replies["inspect.query_task"].items()}
    out.write_text(json.dumps({"replies": replies,
                               "shapes": {key: shape(value) for key, value in replies.items()}},
                              default=str, indent=1), "utf-8")


def raised(call: Any) -> Any:
    """``call()``, or ``{"raised": its exception's class name}``."""
    try:
        return call()
    except Exception as exc:
        return {"raised": type(exc).__name__}


def probe(side: str) -> dict[str, Any]:
    import ctlproj  # the project written above

    app = ctlproj.app
    control = app.control
    deadline = time.monotonic() + 60
    while not control.ping(timeout=0.5):
        if time.monotonic() > deadline:
            raise SystemExit("the worker never answered a ping")
        time.sleep(0.2)
    running = ctlproj.nap.apply_async((10,), queue="q1")
    waiting = ctlproj.nap.apply_async((0.1,), queue="q1")
    later = ctlproj.add.apply_async((1, 2), queue="q1", countdown=120)
    time.sleep(1.5)
    inspect = control.inspect(timeout=2.0)
    # What runs first: Celery's side waits the whole timeout for each call.
    replies: dict[str, Any] = {
        "inspect.active": inspect.active(),
        "inspect.reserved": inspect.reserved(),
        "inspect.query_task": inspect.query_task(running.id),
        "inspect.scheduled": inspect.scheduled(),
        "control.ping": control.ping(timeout=2.0),
        "inspect.ping": inspect.ping(),
        "inspect.registered": inspect.registered(),
        "inspect.registered(rate_limit)": inspect.registered("rate_limit"),
        "inspect.stats": inspect.stats(),
        "inspect.active_queues": inspect.active_queues(),
        "inspect.conf": inspect.conf(),
        "inspect(destination=str).ping": raised(
            lambda: control.inspect(destination=NODE, timeout=2.0).ping()),
        "inspect(destination=nobody).ping": control.inspect(destination=["nobody@nowhere"],
                                                            timeout=0.5).ping(),
        "inspect(pattern).ping": control.inspect(pattern="ctl@*", matcher="glob",
                                                 timeout=2.0).ping(),
        "broadcast(custom)": control.broadcast("bump", arguments={"n": 2}, reply=True,
                                               timeout=2.0),
        "inspect._request(custom)": inspect._request("where"),
        "broadcast(unknown)": control.broadcast("no_such_command", reply=True, timeout=2.0),
        "broadcast(reply=False)": control.broadcast("ping"),
        "add_consumer": control.add_consumer("q2", reply=True, timeout=2.0),
    }
    time.sleep(0.5)
    replies["active_queues after add_consumer"] = sorted(
        queue["name"] for queue in inspect.active_queues()[NODE])
    replies["cancel_consumer"] = control.cancel_consumer("q2", reply=True, timeout=2.0)
    time.sleep(0.5)
    replies["active_queues after cancel_consumer"] = sorted(
        queue["name"] for queue in inspect.active_queues()[NODE])
    replies["time_limit"] = control.time_limit("ctlproj.add", soft=10, hard=20, reply=True,
                                               timeout=2.0)
    replies["time_limit(unknown task)"] = control.time_limit("ctlproj.nope", soft=1,
                                                             reply=True, timeout=2.0)
    replies["rate_limit"] = control.rate_limit("ctlproj.add", "10/m", reply=True, timeout=2.0)
    replies["rate_limit(bad)"] = control.rate_limit("ctlproj.add", "ten", reply=True,
                                                    timeout=2.0)
    replies["pool_grow"] = control.pool_grow(1, reply=True, timeout=2.0)
    for turn in ("enable_events", "enable_events again", "disable_events",
                 "disable_events again"):
        replies[turn] = getattr(control, turn.split()[0])(reply=True, timeout=2.0)
    control.revoke(later.id)
    time.sleep(0.5)
    replies["inspect.revoked has the id"] = later.id in (inspect.revoked() or {}).get(NODE, [])
    replies["reserved lists the waiting task"] = waiting.id in [
        request["id"] for request in replies["inspect.reserved"].get(NODE, [])]
    replies["shutdown"] = control.shutdown(reply=True, timeout=2.0)
    return replies


if __name__ == "__main__":
    main()
