"""Run the canvas programs of ``canvasprog`` (a copy of ``canvas_corpus.py``) on a live worker.

Run by ``canvas_differential.py`` under Celery's interpreter and under ours, the same way:

    python canvas_runner.py SIDE_DIR OUT_JSON WORKER_COMMAND_JSON [--only NAME ...]

``SIDE_DIR`` holds ``canvasprog.py``; the broker settings come from the environment
(``CANVAS_BROKER_URL`` and friends, read by the module). The runner calls the programs'
``setup`` parts, starts the worker command (cwd ``SIDE_DIR``), waits for its "ready." line,
runs every program in one process, stops the worker and writes ``{"programs": {name:
observation}, "meta": {...}}``. Only the standard library is used here (and ``redis`` when
``CANVAS_REDIS_CLEANUP`` names a Redis URL and ``CANVAS_REDIS_PREFIX`` the keys to delete).

A program's observation is made JSON-comparable: task ids are replaced by the place they were
first seen (``<r0.parent>``: the parent of the first result the program looked at), any other
UUID by ``<unknown id>``, exceptions by their type name, module (``akadze_compat`` written as
``celery``) and message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

READY = re.compile(r"\S+@\S+ ready\.")
UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
DEFAULT_TIMEOUT = 10.0
#: How long ``ctx.lines`` waits for a further line once the expected ones are there.
SETTLE_SECONDS = 0.4
#: How long it waits when no line is expected (an errback that must not run).
ABSENT_SECONDS = 1.0
#: Past this many seconds in total, the remaining programs are not run (each records why).
BUDGET_SECONDS = float(os.environ.get("CANVAS_BUDGET_SECONDS", "150"))
_MISSING = object()


def describe_exception(exc: BaseException) -> dict[str, Any]:
    module = type(exc).__module__.replace("akadze_compat", "celery")
    return {"type": type(exc).__name__, "module": module, "message": str(exc)}


def jsonable(value: Any) -> Any:
    def default(obj: Any) -> Any:
        if isinstance(obj, BaseException):
            return {"exception": describe_exception(obj)}
        if isinstance(obj, (set, frozenset)):
            return sorted(obj, key=repr)
        return f"<{type(obj).__name__}>"

    return json.loads(json.dumps(value, default=default))


def _attr(obj: Any, name: str) -> Any:
    """``obj.name``, or ``_MISSING`` when reading it raises (our side may lack it)."""
    try:
        return getattr(obj, name)
    except Exception:
        return _MISSING


def _call(fun: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return jsonable(fun(*args, **kwargs))
    except Exception as exc:
        return {"raised": describe_exception(exc)}


def _members(res: Any) -> list[Any] | None:
    results = _attr(res, "results")
    return list(results) if isinstance(results, (list, tuple)) else None


class Context:
    """What a program gets: waiting, describing results, files for errbacks and callbacks."""

    def __init__(self, name: str, files: Path) -> None:
        self.name = name
        self.files = files / name
        self.files.mkdir(parents=True, exist_ok=True)
        self.labels: dict[str, str] = {}
        self._roots: dict[int, str] = {}

    # ids -> labels
    def _label_of(self, res: Any) -> str:
        key = id(res)
        if key not in self._roots:
            self._roots[key] = f"r{len(self._roots)}"
        return self._roots[key]

    def _register(self, res: Any, label: str, depth: int = 0) -> None:
        if res is None or res is _MISSING or depth > 30:
            return
        task_id = _attr(res, "id")
        if task_id is not _MISSING and task_id is not None:
            self.labels.setdefault(str(task_id), label)
        for index, member in enumerate(_members(res) or []):
            self._register(member, f"{label}.results[{index}]", depth + 1)
        parent = _attr(res, "parent")
        if parent is not _MISSING and parent is not None:
            self._register(parent, f"{label}.parent", depth + 1)

    def see(self, res: Any) -> str:
        label = self._label_of(res)
        self._register(res, label)
        return label

    # outcomes
    def outcome(self, fun: Any) -> dict[str, Any]:
        try:
            value = fun()
        except Exception as exc:
            return {"raised": describe_exception(exc)}
        return {"value": jsonable(value)}

    def get(self, res: Any, timeout: float = DEFAULT_TIMEOUT, propagate: bool = True) \
            -> dict[str, Any]:
        self.see(res)
        return self.outcome(lambda: res.get(timeout=timeout, propagate=propagate))

    def wait(self, res: Any, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """``res``, once ``res.get()`` returned or raised (or ``timeout`` passed)."""
        self.get(res, timeout=timeout)
        return res

    def _leaves(self, res: Any, depth: int = 0) -> list[Any]:
        if res is None or res is _MISSING or depth > 30:
            return []
        members = _members(res)
        found = [res] if members is None else []
        for member in members or []:
            found += self._leaves(member, depth + 1)
        found += self._leaves(_attr(res, "parent"), depth + 1)
        return found

    def settle(self, res: Any, timeout: float = 3.0) -> bool:
        """Wait until every result in ``res``'s tree is ready (or ``timeout`` passes)."""
        self.see(res)
        deadline = time.monotonic() + timeout
        leaves = self._leaves(res)
        while time.monotonic() < deadline:
            if all(_call(leaf.ready) is True for leaf in leaves):
                return True
            time.sleep(0.05)
        return False

    def _node(self, res: Any, label: str, depth: int) -> Any:
        if res is None:
            return None
        if res is _MISSING:
            return "<attribute missing>"
        if depth > 30:
            return "<too deep>"
        node: dict[str, Any] = {"kind": type(res).__name__}
        members = _members(res)
        if members is not None:
            node["results"] = [self._node(member, f"{label}.results[{index}]", depth + 1)
                               for index, member in enumerate(members)]
        else:
            state = _call(lambda: res.state)
            node["state"] = state
            if state in ("FAILURE", "REVOKED"):
                result = _attr(res, "result")
                node["error"] = (type(result).__name__ if isinstance(result, BaseException)
                                 else jsonable(repr(result)))
            elif state == "SUCCESS":
                node["value"] = _call(lambda: res.result)
        node["parent"] = self._node(_attr(res, "parent"), f"{label}.parent", depth + 1)
        return node

    def tree(self, res: Any, settle: float = 2.0) -> Any:
        """The result, its members and its parents: kind, state, value or error type, once
        they are all ready (or ``settle`` seconds passed). Celery sends a chain's next step
        before it stores the step's own result, so a parent can still be PENDING when its
        child has finished."""
        label = self.see(res)
        if settle:
            self.settle(res, settle)
        return self._node(res, label, 0)

    def shape(self, res: Any) -> dict[str, Any]:
        """A GroupResult's or ResultSet's answers."""
        self.see(res)
        members = _members(res)
        return {
            "kind": type(res).__name__,
            "len": _call(len, res),
            "completed_count": _call(lambda: res.completed_count()),
            "successful": _call(lambda: res.successful()),
            "failed": _call(lambda: res.failed()),
            "ready": _call(lambda: res.ready()),
            "waiting": _call(lambda: res.waiting()),
            "states": None if members is None else [_call(lambda m=m: m.state)
                                                    for m in members],
        }

    # files written by callbacks and errbacks
    def path(self, name: str) -> str:
        return str(self.files / f"{name}.jsonl")

    def lines(self, path: str, expect: int, timeout: float = 5.0,
              sort_by: str | None = None) -> list[Any]:
        """The entries written to ``path``: waits for ``expect`` of them, then a little more
        (so that an extra call is seen too). In the order written, or sorted by the entries'
        ``sort_by`` field when that order is not Celery's promise."""
        file = Path(path)

        def read() -> list[Any]:
            if not file.exists():
                return []
            return [json.loads(line) for line in file.read_text("utf-8").splitlines() if line]

        deadline = time.monotonic() + timeout
        while len(read()) < expect and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(SETTLE_SECONDS if expect else ABSENT_SECONDS)
        entries = read()
        if sort_by is not None:
            entries.sort(key=lambda entry: repr(entry.get(sort_by)))
        return entries

    # the observation, made comparable
    def scrub(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self.scrub(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.scrub(item) for item in value]
        if isinstance(value, str):
            if value in self.labels:
                return f"<{self.labels[value]}>"
            for task_id, label in sorted(self.labels.items(), key=lambda kv: -len(kv[0])):
                if len(task_id) >= 8:
                    value = value.replace(task_id, f"<{label}>")
            return UUID.sub("<unknown id>", value)
        return value


def _start_worker(command: list[str], side_dir: Path, log_path: Path) \
        -> tuple[subprocess.Popen[bytes], Any]:
    log = open(log_path, "wb")  # noqa: SIM115 - closed by _stop_worker
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(side_dir), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(command, cwd=side_dir, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not READY.search(log_path.read_text("utf-8", errors="replace")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the worker did not get ready:\n"
                               + log_path.read_text("utf-8", errors="replace")[-4000:])
        time.sleep(0.05)
    return proc, log


def _stop_worker(proc: subprocess.Popen[bytes], log: Any) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    log.close()
    return proc.returncode


def _cleanup_redis() -> None:
    url, prefix = os.environ.get("CANVAS_REDIS_CLEANUP"), os.environ.get("CANVAS_REDIS_PREFIX")
    if not url or not prefix:
        return
    import redis  # only under Celery's interpreter

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def main(argv: list[str]) -> int:
    side_dir, out_path, command = Path(argv[0]), Path(argv[1]), json.loads(argv[2])
    only = set(argv[argv.index("--only") + 1:]) if "--only" in argv else None
    sys.path.insert(0, str(side_dir))
    import canvasprog  # type: ignore[import-not-found]

    files = side_dir / "files"
    programs = {name: entry for name, entry in canvasprog.PROGRAMS.items()
                if only is None or name in only}
    observations: dict[str, Any] = {}
    durations: dict[str, float] = {}
    tracebacks: dict[str, str] = {}
    contexts: dict[str, Context] = {}
    prepared: dict[str, Any] = {}
    started = time.monotonic()
    try:
        for name, (_, setup) in programs.items():
            if setup is not None:
                contexts[name] = Context(name, files)
                try:
                    prepared[name] = setup(contexts[name])
                except Exception as exc:
                    observations[name] = {"setup_error": describe_exception(exc)}
        proc, log = _start_worker(command, side_dir, side_dir / "worker.log")
        try:
            for name, (fun, setup) in programs.items():
                if name in observations:
                    continue
                if time.monotonic() - started > BUDGET_SECONDS:
                    observations[name] = {"not_run": f"over the {BUDGET_SECONDS}s budget"}
                    continue
                ctx = contexts.setdefault(name, Context(name, files))
                began = time.monotonic()
                try:
                    observed = fun(ctx, prepared[name]) if setup is not None else fun(ctx)
                except Exception as exc:
                    observed = {"program_error": describe_exception(exc)}
                    tracebacks[name] = traceback.format_exc(limit=-4)
                durations[name] = round(time.monotonic() - began, 2)
                observations[name] = ctx.scrub(jsonable(observed))
        finally:
            returncode = _stop_worker(proc, log)
    finally:
        _cleanup_redis()
    worker_log = (side_dir / "worker.log").read_text("utf-8", errors="replace")
    out_path.write_text(json.dumps({
        "programs": observations,
        "meta": {"durations": durations, "seconds": round(time.monotonic() - started, 1),
                 "worker_returncode": returncode, "tracebacks": tracebacks,
                 "worker_log_tail": worker_log[-6000:]},
    }, indent=1, sort_keys=True), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
