"""Flower's HTTP API under Celery 5.7 + real Flower 2.2 (Redis) or akadze_compat's ``flower``
command (Postgres): one worker, a few tasks sent through the API, then every endpoint,
recorded as (status, JSON shape).

``python flower_probe.py celery|akadze_compat BROKER_URL OUT.json`` writes a small project,
starts its worker (``-P threads -c 2 -n w1@probe -E``) and the ``flower`` command on a free
port with ``--basic-auth``, drives the API over HTTP (the standard library only) and writes
``{call: [status, body]}`` and ``{call: [status, shape]}`` to OUT. Run by ``test_flower.py``
under each interpreter.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

NODE = "w1@probe"
AUTH = "Basic " + base64.b64encode(b"admin:pw-probe").decode()

PROJECT = '''
import os
import time

from {package} import Celery

app = Celery("flowerproj", broker=os.environ["FLOWER_PROBE_BROKER"],
             backend=os.environ["FLOWER_PROBE_BACKEND"] or None)
app.conf.worker_hijack_root_logger = False


@app.task(name="flowerproj.add")
def add(x, y):
    return x + y


@app.task(name="flowerproj.boom")
def boom(text):
    raise ValueError(text)


@app.task(name="flowerproj.nap")
def nap(seconds):
    time.sleep(seconds)
    return seconds
'''


def shape(value: Any) -> Any:
    """The JSON types of ``value``, keys kept: what the differential test compares."""
    if isinstance(value, dict):
        return {str(key): shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "null"
    return type(value).__name__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Api:
    """The Flower API at ``base``, with basic auth."""

    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, auth: bool = True) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else (
            b"" if method == "POST" else None)
        request = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={**({"Authorization": AUTH} if auth else {}), **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text[:200]


def main() -> None:
    side, broker, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    directory = Path(tempfile.mkdtemp(prefix=f"flower-{side}-", dir=out.resolve().parent))
    package = "celery" if side == "celery" else "akadze_compat"
    (directory / "flowerproj.py").write_text(PROJECT.format(package=package), "utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "FLOWER_PROBE_BROKER": broker,
        "FLOWER_PROBE_BACKEND": broker if side == "celery" else "",
        "AKADZE_POLL_INTERVAL": "0.1", "PYTHONUNBUFFERED": "1"}
    if side == "celery":
        import redis  # Celery's side only: start from an empty broker database

        redis.Redis.from_url(broker).flushdb()
    else:
        subprocess.run([sys.executable, "-m", package, "-A", "flowerproj", "migrate"],
                       cwd=directory, env=env, check=True, capture_output=True)
    port = free_port()
    logs = [open(directory / name, "wb") for name in ("worker.log", "flower.log")]  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", package, "-A", "flowerproj", "worker", "-P", "threads", "-c",
         "2", "-n", NODE, "-E", "-l", "INFO", "--without-heartbeat", "--without-mingle",
         "--without-gossip"], cwd=directory, env=env, stdout=logs[0],
        stderr=subprocess.STDOUT)
    flower = subprocess.Popen(
        [sys.executable, "-m", package, "-A", "flowerproj", "flower", f"--port={port}",
         "--address=127.0.0.1", "--basic-auth=admin:pw-probe"], cwd=directory, env=env,
        stdout=logs[1], stderr=subprocess.STDOUT)
    try:
        replies = probe(Api(f"http://127.0.0.1:{port}"))
    finally:
        for process in (flower, worker):
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()
    out.write_text(json.dumps({
        "replies": replies,
        "shapes": {key: [status, shape(body)] for key, (status, body) in replies.items()}},
        default=str, indent=1), "utf-8")


def by_name(tasks: Any) -> Any:
    """A task list keyed by task name instead of the (different) task ids."""
    if not isinstance(tasks, dict):
        return tasks
    return {task.get("name"): task for task in tasks.values()}


def probe(api: Api) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        try:
            status, workers = api.call("GET", "/api/workers?refresh=1")
            # Every inspect answered: on a loaded host Flower's refresh can time out on one
            # (its inspect timeout is 1 s), and the worker is listed without that key.
            if status == 200 and "stats" in workers.get(NODE, {}):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("flower never listed the worker")
        time.sleep(0.5)
    replies: dict[str, Any] = {}
    replies["async-apply add"] = api.call("POST", "/api/task/async-apply/flowerproj.add",
                                          {"args": [2, 3]})
    replies["async-apply boom"] = api.call("POST", "/api/task/async-apply/flowerproj.boom",
                                           {"args": ["no luck"]})
    replies["send-task nap"] = api.call("POST", "/api/task/send-task/flowerproj.nap",
                                        {"args": [20]})
    replies["apply add"] = api.call("POST", "/api/task/apply/flowerproj.add",
                                    {"args": [1, 1], "timeout": 10})
    add_id = replies["async-apply add"][1]["task-id"]
    boom_id = replies["async-apply boom"][1]["task-id"]
    nap_id = replies["send-task nap"][1]["task-id"]
    deadline = time.monotonic() + 30
    while True:
        tasks = by_name(api.call("GET", "/api/tasks")[1])
        seen = {name: task.get("state") for name, task in tasks.items()}
        if seen.get("flowerproj.boom") == "FAILURE" and seen.get("flowerproj.nap") == \
                "STARTED" and len(tasks) == 3:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the tasks never reached their states: {seen}")
        time.sleep(0.3)
    status, tasks = api.call("GET", "/api/tasks")
    replies["tasks"] = [status, by_name(tasks)]
    status, tasks = api.call("GET", "/api/tasks?limit=1&sort_by=-received")
    replies["tasks limit=1"] = [status, len(tasks)]
    status, tasks = api.call("GET", "/api/tasks?taskname=flowerproj.boom")
    replies["tasks taskname"] = [status, sorted(by_name(tasks))]
    status, tasks = api.call("GET", "/api/tasks?state=FAILURE")
    replies["tasks state"] = [status, sorted(by_name(tasks))]
    status, tasks = api.call("GET", f"/api/tasks?workername={NODE}&taskname=flowerproj.nap")
    replies["tasks workername"] = [status, sorted(by_name(tasks))]
    replies["tasks bad sort_by"] = api.call("GET", "/api/tasks?sort_by=nope")
    replies["tasks bad received_start"] = api.call("GET", "/api/tasks?received_start=x")
    replies["tasks without auth"] = api.call("GET", "/api/tasks", auth=False)
    replies["task types"] = api.call("GET", "/api/task/types")
    replies["task info add"] = api.call("GET", f"/api/task/info/{add_id}")
    replies["task info boom"] = api.call("GET", f"/api/task/info/{boom_id}")
    replies["task info nap"] = api.call("GET", f"/api/task/info/{nap_id}")
    replies["task info unknown"] = api.call("GET", "/api/task/info/no-such-task")
    replies["task result add"] = api.call("GET", f"/api/task/result/{add_id}")
    replies["task result boom"] = api.call("GET", f"/api/task/result/{boom_id}")
    replies["task result nap timeout"] = api.call("GET", f"/api/task/result/{nap_id}?timeout=0.2")
    replies["task result nap"] = api.call("GET", f"/api/task/result/{nap_id}")
    replies["async-apply unknown task"] = api.call(
        "POST", "/api/task/async-apply/flowerproj.nope", {"args": []})
    replies["async-apply args not a list"] = api.call(
        "POST", "/api/task/async-apply/flowerproj.add", {"args": "12"})
    status, workers = api.call("GET", "/api/workers")
    replies["workers"] = [status, {NODE: sorted(workers.get(NODE, {}))}]
    status, workers = api.call("GET", f"/api/workers?workername={NODE}&refresh=true")
    replies["workers one refreshed"] = [status, {NODE: sorted(workers.get(NODE, {}))}]
    replies["workers status"] = api.call("GET", "/api/workers?status=true")
    replies["workers unknown"] = api.call("GET", "/api/workers?workername=nobody@nowhere")
    replies["pool grow"] = api.call("POST", f"/api/worker/pool/grow/{NODE}?n=1")
    replies["pool shrink"] = api.call("POST", f"/api/worker/pool/shrink/{NODE}?n=1")
    replies["pool grow unknown worker"] = api.call("POST", "/api/worker/pool/grow/nobody@x")
    replies["add consumer"] = api.call("POST", f"/api/worker/queue/add-consumer/{NODE}?queue=q2")
    replies["cancel consumer"] = api.call(
        "POST", f"/api/worker/queue/cancel-consumer/{NODE}?queue=q2")
    replies["add consumer without queue"] = api.call(
        "POST", f"/api/worker/queue/add-consumer/{NODE}")
    replies["task timeout"] = api.call(
        "POST", f"/api/task/timeout/flowerproj.add?workername={NODE}&soft=10&hard=20")
    replies["task timeout unknown task"] = api.call(
        "POST", f"/api/task/timeout/flowerproj.nope?workername={NODE}&soft=1")
    replies["task rate-limit"] = api.call(
        "POST", f"/api/task/rate-limit/flowerproj.add?workername={NODE}&ratelimit=10/m")
    replies["task revoke"] = api.call("POST", f"/api/task/revoke/{nap_id}?terminate=true")
    replies["task abort"] = api.call("POST", f"/api/task/abort/{add_id}")
    replies["shutdown"] = api.call("POST", f"/api/worker/shutdown/{NODE}")
    # A state read as the call returns races the worker on either side (Flower's own
    # answer was SUCCESS once): any state the task may have reached by then reads the same.
    reachable = {"async-apply add": ("PENDING", "RECEIVED", "STARTED", "SUCCESS"),
                 "async-apply boom": ("PENDING", "RECEIVED", "STARTED", "FAILURE"),
                 "send-task nap": ("PENDING", "RECEIVED", "STARTED")}
    for call, states in reachable.items():
        status, body = replies[call]
        if isinstance(body, dict) and body.get("state") in states:
            body["state"] = "<a state the task can have reached>"
    # The task ids differ: one name for them, so both sides' values compare.
    for call in ("async-apply add", "async-apply boom", "send-task nap", "apply add",
                 "task result add", "task result boom", "task result nap timeout",
                 "task result nap"):
        status, body = replies[call]
        if isinstance(body, dict) and "task-id" in body:
            body["task-id"] = "<task id>"
    for call in ("task revoke", "task abort"):
        status, body = replies[call]
        replies[call] = [status, {"message": body["message"].replace(nap_id, "<id>").replace(
            add_id, "<id>")} if isinstance(body, dict) else body]
    return replies


if __name__ == "__main__":
    main()
