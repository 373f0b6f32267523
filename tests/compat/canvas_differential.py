"""The canvas differential: ``canvas_corpus.py`` run under Celery 5.7 on Redis and under
akadze_compat on Postgres, one worker per side, both sides at once.

- ``corpus_source(side)``: the corpus as that side's user writes it. Celery's is the file as
  it is; ours has its ``celery`` imports renamed to ``akadze_compat`` and nothing else changed
  (``rename_celery_imports``), as a user migrating does.
- ``start_side(...)``: writes it as ``canvasprog.py`` into a fresh directory and starts
  ``canvas_runner.py`` under that side's interpreter, which runs the worker and every program.
- ``differences(celery, ours)``: the fields where two observations differ, as paths.

``python -m tests.compat.canvas_differential --record`` runs the Celery side alone and writes
``canvas_celery_observations.json``: a reviewable record of what Celery does, which the tests
check the live run against.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.compat import differential

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
CORPUS = HERE / "canvas_corpus.py"
RUNNER = HERE / "canvas_runner.py"
RECORDED = HERE / "canvas_celery_observations.json"
#: Redis for Celery's broker and result backend; every key is under a per-run prefix, deleted
#: afterwards (nothing is flushed: other sessions may share the database).
REDIS_URL = os.environ.get("CANVAS_DIFF_REDIS_URL", "redis://127.0.0.1:6379/11")
RUN_TIMEOUT_SECONDS = 240
#: Where our side's ``akadze_compat`` and ``akadze_core`` are imported from: this checkout, or
#: ``CANVAS_DIFF_OURS_PATH`` (another checkout, to try a branch in progress).
OURS_PATH = os.environ.get("CANVAS_DIFF_OURS_PATH", str(REPOSITORY))

PAGE = REPOSITORY / "migration_guide" / "celery-canvas.md"

class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: A documented difference that does not pin our side's value.
ANY: Any = _Any()

@dataclass(frozen=True)
class Known:
    """A documented difference at one field: why, and what our side must give there."""

    reason: str
    ours: Any = ANY


#: program -> {field path ("" for the whole observation): Known(why, what ours gives)}.
#: Only Celery's own bugs and what akadze_compat does differently on purpose; each names the
#: value our side must give there (``ANY``: not pinned), so that the field is still checked.
KNOWN_DIFFERENCES: dict[str, dict[str, Known]] = {
    "chain_failure_before_group": {
        "get.raised": Known(
            "Celery bug (celery#6437, an xfail in its own test_canvas.py on Redis): a chain "
            "that fails before the group it ends with never completes; get() times out. "
            "akadze_compat raises the failing step's exception, as on Celery's other backends",
            {"type": "ExpectedException", "module": "canvasprog",
             "message": "expected failure [2]"}),
    },
    "chord_of_chords_header_failure": {
        "errbacks": Known(
            "Celery is of two minds here: when a chord's header fails and its body is a "
            "chord, it calls the errbacks of that chord's link_error option (Celery's own "
            "test_link_error_option_runs_on_header_failure[chord]) but not those linked to "
            "the inner chord with link_error(), which go to its body. akadze_compat fails the "
            "inner chord's body with the ChordError and runs all its errbacks, once",
            [{"id": "<r0>", "style": "old"}]),
    },
    "chord_of_implicit_chords_header_failure": {
        "errbacks[0].id": Known(
            "Celery links the result of a chain that is a chord's body and holds a chord "
            "straight to the outer header, past the chain's earlier steps, and names the "
            "errback's failed task by the chain's id; akadze_compat links each step to the one "
            "before and calls the errback for the step that failed, which is among the "
            "result's parents",
            "<r0.parent.parent>"),
        "get.raised": Known(
            "(the same parents: get() checks them first, meets the inner chord's failed "
            "header member and raises its exception, where Celery, not seeing it, raises the "
            "result's ChordError; Celery's own test_chain_of_implicit_chords_body_failure "
            "accepts either)",
            {"type": "ExpectedException", "module": "canvasprog",
             "message": "expected failure []"}),
    },
    "chord_of_implicit_chords_body_failure": {
        "errbacks[0].id": Known(
            "(the parents of chord_of_implicit_chords_header_failure: the failed first step "
            "of the inner body is among the result's parents here)",
            "<r0.parent.parent>"),
    },
    "chord_header_group_unrolls": {
        "get.value": Known(
            "Celery bug: a group nested in a chord header is unrolled in reverse on Redis, so "
            "the body gets [43, 42]; akadze_compat keeps header order, as Celery documents",
            [42, 43]),
    },
    "revoke_chain_head_before_worker": {
        "get": Known(
            "Celery keeps revokes in worker memory, sent by broadcast: a revoke sent while no "
            "worker runs is lost and the chain runs. akadze_compat stores it in the database: "
            "the head is revoked and the rest of the chain is not run",
            {"raised": {"type": "TaskRevokedError", "module": "celery.exceptions",
                        "message": "revoked"}}),
        "res": Known("(the same lost revoke: Celery ran both steps; what our tail reads is "
                     "checked by revoke_chain_head_waiting_on_countdown)"),
        "res.parent": Known("(the same lost revoke: our head is revoked)",
                            {"kind": "AsyncResult", "state": "REVOKED",
                             "error": "TaskRevokedError", "parent": None}),
    },
    "revoke_group_before_worker": {
        "get": Known(
            "Celery loses a revoke sent while no worker runs (see "
            "revoke_chain_head_before_worker); akadze_compat revokes every member",
            {"raised": {"type": "TaskRevokedError", "module": "celery.exceptions",
                        "message": "revoked"}}),
        "shape": Known("(the same lost revoke: Celery ran both members)",
                       {"kind": "GroupResult", "len": 2, "completed_count": 0,
                        "successful": False, "failed": False, "ready": True,
                        "waiting": False, "states": ["REVOKED", "REVOKED"]}),
    },
}


_IMPORT = re.compile(r"^(\s*)(from\s+celery)(\.[\w.]+)?(\s+import\b)", re.MULTILINE)
_PLAIN_IMPORT = re.compile(r"^(\s*)import\s+celery(\.[\w.]+)?\s*$", re.MULTILINE)


def rename_celery_imports(source: str) -> str:
    """``from celery[.x] import ...`` -> ``from akadze_compat[.x] import ...`` and ``import
    celery[.x]`` -> ``import akadze_compat[.x] as celery[.x]``-style: what a migrating user
    changes. Fails when a ``celery`` import is left that this does not understand."""
    renamed = _IMPORT.sub(lambda m: f"{m[1]}from akadze_compat{m[3] or ''}{m[4]}", source)
    renamed = _PLAIN_IMPORT.sub(
        lambda m: f"{m[1]}import akadze_compat{m[2] or ''} as celery", renamed)
    for node in ast.walk(ast.parse(renamed)):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [])
        left = [name for name in names if name == "celery" or name.startswith("celery.")]
        if left:
            raise AssertionError(f"a celery import is left after renaming: {left}")
    return renamed


def corpus_source(side: str) -> str:
    source = CORPUS.read_text("utf-8")
    return source if side == "celery" else rename_celery_imports(source)


def program_names() -> list[str]:
    """The ``@program`` functions of the corpus, in file order (read, not imported)."""
    names = []
    for node in ast.parse(CORPUS.read_text("utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Name) and target.id == "program":
                    names.append(node.name)
    return names


def redis_reachable(url: str = REDIS_URL) -> str:
    """'' when a Redis answers at ``url``, else why not."""
    match = re.match(r"redis://([^:/]+)(?::(\d+))?", url)
    if match is None:
        return f"not a redis:// URL: {url}"
    host, port = match[1], int(match[2] or 6379)
    try:
        with socket.create_connection((host, port), timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            if not conn.recv(16).startswith(b"+PONG"):
                return f"no PONG from Redis at {host}:{port}"
    except OSError as exc:
        return f"no Redis at {host}:{port} ({exc}): start one, or set CANVAS_DIFF_REDIS_URL"
    return ""


def celery_unavailable() -> str:
    """'' when Celery 5.7 and Redis are there, else the reason to skip."""
    python = differential.celery_python()
    if not Path(python).is_file():
        return differential.no_celery_reason(python)
    version = subprocess.run([python, "-c", "import celery, redis; print(celery.__version__)"],
                             capture_output=True, text=True, timeout=60, check=False)
    if version.returncode != 0:
        return f"{python} cannot import celery and redis: {version.stderr.strip()[-300:]}"
    if not version.stdout.strip().startswith(differential.CELERY_SERIES):
        return (f"{python} has Celery {version.stdout.strip()}; the canvas differential "
                f"compares with {differential.CELERY_SERIES}x")
    return redis_reachable()


@dataclass
class Side:
    """One side's run in progress."""

    name: str
    directory: Path
    out: Path
    proc: subprocess.Popen[str]

    def result(self) -> dict[str, Any]:
        try:
            _, stderr = self.proc.communicate(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, stderr = self.proc.communicate()
            raise AssertionError(f"the {self.name} canvas run took over "
                                 f"{RUN_TIMEOUT_SECONDS}s:\n{stderr[-3000:]}") from None
        if self.proc.returncode != 0 or not self.out.exists():
            raise AssertionError(f"the {self.name} canvas run failed "
                                 f"({self.proc.returncode}):\n{stderr[-5000:]}")
        observed: dict[str, Any] = json.loads(self.out.read_text("utf-8"))
        return observed


def start_side(side: str, directory: Path, *, database_url: str | None = None,
               only: list[str] | None = None) -> Side:
    """Start the run of one side (``"celery"`` or ``"akadze_compat"``) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "canvasprog.py").write_text(corpus_source(side), "utf-8")
    node = f"canvasdiff{os.getpid()}{side[:1]}@%h"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("CELERY_", "AKADZE_", "CANVAS_")) and key != "PYTHONPATH"}
    if side == "celery":
        python = differential.celery_python()
        prefix = f"canvasdiff-{os.getpid()}-{uuid.uuid4().hex[:8]}:"
        env.update(CANVAS_BROKER_URL=REDIS_URL, CANVAS_RESULT_BACKEND=REDIS_URL,
                   CANVAS_REDIS_PREFIX=prefix, CANVAS_REDIS_CLEANUP=REDIS_URL)
        worker = [python, "-m", "celery", "-A", "canvasprog", "worker", "-P", "threads",
                  "-c", "4", "-l", "INFO", "-n", node, "--without-mingle", "--without-gossip",
                  "--without-heartbeat"]
    else:
        assert database_url, "our side needs a database"
        python = sys.executable
        env.update(CANVAS_BROKER_URL=database_url, PYTHONPATH=OURS_PATH,
                   AKADZE_POLL_INTERVAL="0.1")
        worker = [python, "-m", "akadze_compat", "-A", "canvasprog", "worker", "-P", "threads",
                  "-c", "4", "-l", "INFO", "-n", node]
    out = directory / "observations.json"
    arguments = [python, str(RUNNER), str(directory), str(out), json.dumps(worker)]
    if only:
        arguments += ["--only", *only]
    proc = subprocess.Popen(arguments, cwd=directory, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return Side(side, directory, out, proc)


ABSENT = "<absent>"


def _compare(left: Any, right: Any, path: str, into: dict[str, tuple[Any, Any]]) -> None:
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right)):
            _compare(left.get(key, ABSENT), right.get(key, ABSENT),
                     f"{path}.{key}" if path else key, into)
    elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            _compare(a, b, f"{path}[{index}]", into)
    elif left != right:
        into[path] = (left, right)


def covered(path: str, prefix: str) -> bool:
    """Whether a documented difference at ``prefix`` covers a difference found at ``path``
    (the same field, one inside it, or one that contains it)."""
    def inside(inner: str, outer: str) -> bool:
        return outer == "" or inner == outer or inner.startswith((f"{outer}.", f"{outer}["))

    return inside(path, prefix) or inside(prefix, path)


def differences(celery: Any, ours: Any) -> dict[str, tuple[Any, Any]]:
    """The fields whose values differ, as ``{path: (celery's, ours)}``: dicts compared key by
    key, lists of one length item by item, anything else (or a missing key, ``<absent>``) as
    a whole. ``""`` is the path of the whole observation."""
    found: dict[str, tuple[Any, Any]] = {}
    _compare(celery, ours, "", found)
    return found


_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def value_at(observation: Any, path: str) -> Any:
    """The value at ``path`` (as ``differences`` writes paths), or ``<absent>``."""
    value = observation
    for key, index in _STEP.findall(path):
        if key and isinstance(value, dict) and key in value:
            value = value[key]
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return ABSENT
    return value


def record(path: Path = RECORDED) -> dict[str, Any]:
    """Run the Celery side alone and write its observations to ``path``."""
    reason = celery_unavailable()
    if reason:
        raise SystemExit(reason)
    began = time.monotonic()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="canvas-diff-celery-") as tmp:
        observed = start_side("celery", Path(tmp)).result()
    path.write_text(json.dumps({
        "about": "Celery 5.7 on Redis running tests/compat/canvas_corpus.py: written by "
                 "`python -m tests.compat.canvas_differential --record`",
        "programs": observed["programs"],
    }, indent=1, sort_keys=True) + "\n", "utf-8")
    print(f"recorded {len(observed['programs'])} programs in {time.monotonic() - began:.1f}s "
          f"to {path}")
    return observed


def _summary(observation: dict[str, Any]) -> str:
    """What a program's calls gave under Celery, in a few words per field."""
    parts = []
    if "program_error" in observation:
        return f"the program raised `{observation['program_error']['type']}`"
    for key, value in observation.items():
        if isinstance(value, dict) and set(value) == {"value"}:
            shown = json.dumps(value["value"])
            parts.append(f"{key}: `{shown if len(shown) <= 48 else shown[:45] + '...'}`")
        elif isinstance(value, dict) and set(value) == {"raised"}:
            parts.append(f"{key}: raises `{value['raised']['type']}`")
        elif key in ("errbacks", "calls") and isinstance(value, list):
            styles = sorted({entry.get("style", "") for entry in value} - {""})
            parts.append(f"{key}: {len(value)}" + (f" ({', '.join(styles)} style)"
                                                   if styles else ""))
    return "; ".join(parts) or "(see the recorded observation)"


def render_page(recorded: Path = RECORDED) -> str:
    """``migration_guide/celery-canvas.md``: each program, what Celery gives, and where
    akadze_compat differs on purpose."""
    programs = json.loads(recorded.read_text("utf-8"))["programs"]
    lines = [
        "<!-- Generated by `python -m tests.compat.canvas_differential --page` from "
        "tests/compat/canvas_celery_observations.json and KNOWN_DIFFERENCES in "
        "tests/compat/canvas_differential.py; edit those, not this file. -->",
        "",
        "# Canvas under Celery 5.7 and akadze_compat",
        "",
        "Every canvas program of [tests/compat/canvas_corpus.py](../tests/compat/canvas_corpus.py)"
        " runs under real Celery 5.7 (Redis broker and result backend, a `-P threads -c 4` "
        "worker) and under akadze_compat (Postgres, an `akadze-compat worker -P threads -c 4`), "
        "written once with `from celery import ...` and renamed to `akadze_compat` for ours, as "
        "a migrating user does. `tests/compat/test_canvas_differential.py` compares the two "
        "observations field by field: returned values, exceptions (type, module, message), "
        "the state and value of every result and of its parents and members, `GroupResult` "
        "shapes, and the calls errbacks and callbacks record. A field may differ only where "
        "this page says why (and akadze_compat must then give what the page says); anywhere "
        "else the test fails unless akadze_compat gives what Celery gives.",
        "",
        "## Where akadze_compat differs from Celery, on purpose",
        "",
        "| program | field | why | akadze_compat gives |",
        "|---|---|---|---|",
    ]
    for name, fields in KNOWN_DIFFERENCES.items():
        for path, known in fields.items():
            ours = "(not pinned)" if known.ours is ANY else f"`{json.dumps(known.ours)}`"
            lines.append(f"| `{name}` | `{path or '(all)'}` | {known.reason} | {ours} |")
    lines += ["", "## What Celery 5.7 gives", "",
              f"{len(programs)} programs; `get` is `.get(timeout=...)` on the canvas's "
              "result (its value, or the exception it raises).", "",
              "| program | Celery 5.7 on Redis | akadze_compat must give |", "|---|---|---|"]
    for name in program_names():
        if name not in programs:
            continue
        ours = ("the same, except as above" if name in KNOWN_DIFFERENCES
                else "the same, field by field")
        lines.append(f"| `{name}` | {_summary(programs[name])} | {ours} |")
    return "\n".join(lines) + "\n"


def compare(only: list[str] | None = None) -> int:
    """Run both sides (a fresh database ``canvas_diff_<pid>``, dropped afterwards) and print
    the differences no ``KNOWN_DIFFERENCES`` entry explains; 1 when there are some."""
    import tempfile

    import psycopg
    from psycopg import sql

    from akadze_core.store.migrations import migrate
    from tests.conftest import DEFAULT_ADMIN_URL, database_url_for

    reason = celery_unavailable()
    if reason:
        raise SystemExit(reason)
    admin_url = os.environ.get("AKADZE_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)
    name = f"canvas_diff_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = database_url_for(admin_url, name)
        with psycopg.connect(url, autocommit=True) as connection:
            migrate(connection)
        with tempfile.TemporaryDirectory(prefix="canvas-diff-") as tmp:
            sides = [start_side("celery", Path(tmp) / "celery", only=only),
                     start_side("akadze_compat", Path(tmp) / "akadze_compat",
                                database_url=url, only=only)]
            celery, ours = (side.result() for side in sides)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    failing = 0
    for program, observed in celery["programs"].items():
        allowed = KNOWN_DIFFERENCES.get(program, {})
        found = {path: values for path, values in
                 differences(observed, ours["programs"][program]).items()
                 if not any(covered(path, prefix) for prefix in allowed)}
        if found:
            failing += 1
            print(f"== {program}")
            for path, (left, right) in found.items():
                print(f"   {path or '(all)'}\n      celery: {json.dumps(left)[:300]}\n"
                      f"      ours:   {json.dumps(right)[:300]}")
    print(f"{failing} of {len(celery['programs'])} programs differ "
          f"(celery {celery['meta']['seconds']}s, ours {ours['meta']['seconds']}s)")
    return 1 if failing else 0


USAGE = """usage: python -m tests.compat.canvas_differential --record | --page | --compare [NAME...]
  --record   run Celery alone, rewrite canvas_celery_observations.json and the guide's page
  --page     rewrite migration_guide/celery-canvas.md from the recorded observations
  --compare  run both sides now and print every unexplained difference (CANVAS_DIFF_OURS_PATH
             runs our side from another checkout)"""


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(sys.argv[2:] or None))
    if sys.argv[1:] == ["--record"]:
        record()
        PAGE.write_text(render_page(), "utf-8")
    elif sys.argv[1:] == ["--page"]:
        PAGE.write_text(render_page(), "utf-8")
    else:
        raise SystemExit(USAGE)
