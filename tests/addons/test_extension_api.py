"""Celery's task-class and worker extension API, as add-ons and projects use it, compared
with Celery 5.7: ``Task._get_app``/``bind``/``annotate``, class-level ``Task.app``,
``task_annotations``; ``app.steps`` with ``bootsteps.StartStopStep`` run at their points of
the worker's life (the liveness-probe recipe), their set-up in the prefork children, and
``bootsteps.ConsumerStep`` refused at the worker's start; ``beat.Scheduler``/``ScheduleEntry``
subclassed and driven as celery-redbeat does.

The same script runs in Celery's interpreter (``CELERY_PYTHON``, skipped when absent) and in
this one with the celery alias on: the code is written against ``celery``, unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.compat import differential

ROOT = Path(__file__).resolve().parents[2]
#: The Redis database this file uses (other add-on tests take 9 and 11 to 14).
REDIS_URL = "redis://127.0.0.1:6379/15"


def celery_python() -> str:
    python = differential.celery_python()
    if not Path(python).is_file():
        pytest.skip(differential.no_celery_reason(python))
    return python


def run_script(code: str, python: str, cwd: Path = ROOT,
               env: dict[str, str] | None = None) -> Any:
    """``code`` run by ``python`` with the alias on; its last stdout line, as JSON."""
    completed = subprocess.run(
        [python, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd,
        env={**os.environ, "AKADZE_CELERY": "1", **(env or {})}, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def both(code: str, env: dict[str, str] | None = None) -> tuple[Any, Any]:
    """(on Celery, on akadze) for the same script."""
    return run_script(code, celery_python(), env=env), run_script(code, sys.executable, env=env)


TASK_CLASS_API = """
    import json
    from celery import Celery, Task

    def around(method):
        def wrapper(self, *args, **kwargs):
            seen.append(["around", method.__name__])
            return method(self, *args, **kwargs)
        return wrapper

    class Annotator:
        def annotate(self, task):
            if task.name == "proj.mul":
                return {"priority": 7}

    seen = []
    app = Celery("proj", set_as_current=False)
    app.conf.task_annotations = [
        {"proj.add": {"rate_limit": "10/s", "@on_failure": around}, "*": {"acks_late": True}},
        Annotator(),
    ]

    class Base(Task):
        abstract = True
        marker = "base"

    @app.task(name="proj.add", base=Base)
    def add(x, y):
        return x + y

    @app.task(name="proj.mul")
    def mul(x, y):
        return x * y

    app.finalize()
    add.on_failure(ValueError("x"), "id", (), {}, None)
    other = Celery("other", set_as_current=False)
    class Unbound(Task):
        pass
    print(json.dumps({
        "get_app": [add.__class__._get_app() is app, add._get_app() is app],
        "class_app": [add.__class__.app is app, add.app is app, Base.app is not None],
        "annotated": [add.rate_limit, add.acks_late, mul.rate_limit, mul.acks_late,
                      mul.priority, add.priority],
        "around": seen,
        "wrapped_kept": add.__class__.on_failure.__wrapped__.__name__,
        "annotations": [type(item).__name__ for item in app.annotations],
        "bind_returns": Unbound.bind(other) is other and Unbound.app is other
                        and Unbound._get_app() is other,
        "marker": add.marker,
    }))
"""


def test_task_class_api_and_annotations_match_celery() -> None:
    on_celery, on_akadze = both(TASK_CLASS_API)
    assert on_akadze == on_celery
    assert on_akadze["annotated"] == ["10/s", True, None, True, 7, None]


def test_instance_assignment_of_app_binds_the_class() -> None:
    code = """
        import json
        from celery import Celery, Task
        app = Celery("proj", set_as_current=False)
        app.conf.task_annotations = {"*": {"typing": False}}
        class MyTask(Task):
            name = "proj.mine"
            def run(self):
                return 1
        task = MyTask()
        task.app = app
        print(json.dumps([MyTask._app is app, MyTask.__bound__, MyTask.typing]))
    """
    on_celery, on_akadze = both(code)
    assert on_akadze == on_celery == [True, True, False]


BOOTSTEP_NAMES = """
    import json
    from celery import bootsteps

    class First(bootsteps.StartStopStep):
        pass

    class Second(bootsteps.Step):
        requires = ("__main__:First", "celery.worker.components:Timer")
        label = "second"

    print(json.dumps([First.name, str(First), First.__qualname__, repr(First(None)),
                      repr(Second(None)), First(None).include_if(None), Second.requires[0]]))
"""


def test_step_classes_are_named_as_celery_names_them() -> None:
    on_celery, on_akadze = both(BOOTSTEP_NAMES)
    assert on_akadze == on_celery


CONSUMER_STEP_CLASS = """
    import json
    from celery import Celery, bootsteps
    from kombu import Consumer, Queue

    class MyConsumerStep(bootsteps.ConsumerStep):
        def get_consumers(self, channel):
            return [Consumer(channel, queues=[Queue("custom")], callbacks=[print])]

    app = Celery("proj", set_as_current=False)
    app.steps["consumer"].add(MyConsumerStep)
    step = MyConsumerStep(None)
    print(json.dumps([MyConsumerStep.name, list(MyConsumerStep.requires), step.consumers,
                      isinstance(step, bootsteps.StartStopStep),
                      MyConsumerStep in app.steps["consumer"]]))
"""


def test_a_consumer_step_imports_and_subclasses_as_on_celery() -> None:
    on_celery, on_akadze = both(CONSUMER_STEP_CLASS)
    assert on_akadze == on_celery == [
        "__main__.MyConsumerStep", ["celery.worker.consumer:Connection"], None, True, True]


def test_the_worker_refuses_to_start_with_a_consumer_step(tmp_path: Path,
                                                        database_url: str) -> None:
    """Its get_consumers needs a kombu channel, which akadze's worker has not: the worker
    exits at start, saying why (support.CONSUMER_STEP), before it claims anything."""
    from akadze_compat.support import CONSUMER_STEP

    (tmp_path / "consumerproj.py").write_text(textwrap.dedent('''
        from celery import Celery, bootsteps

        class MyConsumerStep(bootsteps.ConsumerStep):
            def get_consumers(self, channel):
                raise AssertionError("never called: there is no channel")

        app = Celery("consumerproj")
        app.steps["consumer"].add(MyConsumerStep)
    '''))
    env = {key: value for key, value in os.environ.items()
           if key not in ("AKADZE_DATABASE_URL", "CELERY_BROKER_URL", "AKADZE_CELERY")}
    done = subprocess.run([str(Path(sys.executable).with_name("akadze-compat")), "-b",
                           database_url, "-A", "consumerproj", "worker", "-P", "solo"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "a boot step failed to start: NotImplementedError: MyConsumerStep (a " \
        "bootsteps.ConsumerStep) cannot run on akadze: " in output
    assert " ".join(CONSUMER_STEP.split()) in " ".join(output.split())
    assert "ready." not in output and "never called" not in output


#: A project with the liveness-probe boot step as it is usually written for Celery, recording
#: the order of what happens to $EVENTS.
PROBE_PROJECT = '''
import os
from pathlib import Path

from celery import Celery, bootsteps
from celery.signals import worker_init, worker_ready, worker_shutdown

EVENTS = Path(os.environ["EVENTS"])
HEARTBEAT_FILE = Path(os.environ["HEARTBEAT"])


def record(what):
    with EVENTS.open("a") as events:
        events.write(what + "\\n")


class LivenessProbe(bootsteps.StartStopStep):
    requires = {"celery.worker.components:Timer"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.tref = None
        record("step init")

    def start(self, worker):
        record("step start")
        self.tref = worker.timer.call_repeatedly(
            0.2, self.update_heartbeat_file, (worker,), priority=10)

    def stop(self, worker):
        record("step stop")
        if self.tref is not None:
            self.tref.cancel()
        HEARTBEAT_FILE.unlink(missing_ok=True)

    def update_heartbeat_file(self, worker):
        if not HEARTBEAT_FILE.exists():
            record("heartbeat")
        HEARTBEAT_FILE.touch()


class Disabled(bootsteps.StartStopStep):
    def include_if(self, worker):
        return False

    def start(self, worker):
        record("disabled step started")


worker_init.connect(lambda **_: record("worker_init"), weak=False)
worker_ready.connect(lambda **_: record("worker_ready"), weak=False)
worker_shutdown.connect(lambda **_: record("worker_shutdown"), weak=False)

app = Celery("probeproj", broker=os.environ["BROKER"])
app.steps["worker"].add(LivenessProbe)
app.steps["worker"].add(Disabled)


@app.task
def ping():
    return "pong"
'''


def _run_probe_worker(tmp_path: Path, command: list[str], broker: str) -> list[str]:
    project = tmp_path / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "probeproj.py").write_text(PROBE_PROJECT)
    events, heartbeat = tmp_path / "events.txt", tmp_path / "heartbeat"
    events.unlink(missing_ok=True)
    env = {key: value for key, value in os.environ.items()
           if key not in ("AKADZE_DATABASE_URL", "CELERY_BROKER_URL", "AKADZE_CELERY")}
    env.update(EVENTS=str(events), HEARTBEAT=str(heartbeat), BROKER=broker,
               PYTHONUNBUFFERED="1", AKADZE_POLL_INTERVAL="0.1")
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen([*command, "-A", "probeproj", "worker", "-P", "solo",
                                "-l", "INFO"], cwd=project, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not heartbeat.exists() or "worker_ready" not in _read(events):
            assert process.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        touched = heartbeat.stat().st_mtime
        while heartbeat.stat().st_mtime == touched:  # the timer keeps touching it
            assert time.monotonic() < deadline, "the heartbeat file is not touched again"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, (tmp_path / "worker.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    assert not heartbeat.exists(), "the step's stop() did not run"
    return _read(events).splitlines()


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.mark.slow
def test_a_liveness_probe_step_starts_and_stops_with_the_worker(tmp_path: Path,
                                                                database_url: str) -> None:
    script = Path(sys.executable).with_name("akadze-compat")
    on_akadze = _run_probe_worker(tmp_path, [str(script)], database_url)
    # The first heartbeat may come before or after worker_ready.
    assert [event for event in on_akadze if event != "heartbeat"] == [
        "worker_init", "step init", "step start", "worker_ready", "step stop",
        "worker_shutdown"]
    assert on_akadze.count("heartbeat") == 1


@pytest.mark.slow
def test_the_liveness_probe_step_runs_where_celery_runs_it(tmp_path: Path,
                                                          database_url: str) -> None:
    python = celery_python()
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    on_celery = _run_probe_worker(tmp_path / "celery", [python, "-m", "celery"], REDIS_URL)
    script = Path(sys.executable).with_name("akadze-compat")
    on_akadze = _run_probe_worker(tmp_path / "akadze", [str(script)], database_url)
    # The first heartbeat races worker_ready on both: compare the order of the rest.
    assert [e for e in on_akadze if e != "heartbeat"] == \
        [e for e in on_celery if e != "heartbeat"]


BEAT_SUBCLASS = """
    import json
    from datetime import datetime, timedelta, timezone
    from celery import Celery
    from celery.beat import DEFAULT_MAX_INTERVAL, ScheduleEntry, Scheduler
    from celery.schedules import schedule

    app = Celery("proj", set_as_current=False)
    app.conf.beat_schedule = {"every-10s": {"task": "proj.add", "schedule": 10.0,
                                            "args": (1, 2)}}
    sent = []

    class MyEntry(ScheduleEntry):
        def _next_instance(self, last_run_at=None):
            entry = super()._next_instance(last_run_at=last_run_at)
            entry.custom = "kept"
            return entry

    class MyScheduler(Scheduler):
        Entry = MyEntry

        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            sent.append([entry.name, entry.task, list(entry.args), entry.total_run_count])
            return None

    scheduler = MyScheduler(app)
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    scheduler.schedule["every-10s"].last_run_at = long_ago
    first = scheduler.tick()
    second = scheduler.tick()
    entry = scheduler.schedule["every-10s"]
    added = scheduler.add(name="added", task="proj.mul", schedule=schedule(60), args=(2,))
    lazy = MyScheduler(app, lazy=True)
    print(json.dumps({
        "max_interval": [DEFAULT_MAX_INTERVAL, scheduler.max_interval],
        "names": sorted(scheduler.schedule),
        "sent": sent, "first": first, "second_under": 9 < second <= 10,
        "entry": [type(entry).__name__, entry.total_run_count, getattr(entry, "custom", None),
                  entry.last_run_at > long_ago],
        "added": [type(added).__name__, added.args, added.kwargs, added.options],
        "lazy": lazy.schedule,
        "repr": repr(added).startswith("<MyEntry: added proj.mul(2)"),
        "equal": entry == MyEntry(name="every-10s", task="proj.add", schedule=10.0,
                                  args=(1, 2), app=app),
    }))
"""


def test_a_scheduler_subclass_runs_as_on_celery() -> None:
    on_celery, on_akadze = both(BEAT_SUBCLASS)
    assert on_akadze == on_celery
    assert on_akadze["sent"] == [["every-10s", "proj.add", [1, 2], 0]]


def test_redbeat_scheduler_is_built_on_akadze_classes() -> None:
    pytest.importorskip("redbeat")
    seen = run_script("""
        import json
        from redbeat.schedulers import RedBeatScheduler, RedBeatSchedulerEntry
        import akadze_compat.beat
        print(json.dumps([issubclass(RedBeatScheduler, akadze_compat.beat.Scheduler),
                          issubclass(RedBeatSchedulerEntry, akadze_compat.beat.ScheduleEntry)]))
    """, sys.executable)
    assert seen == [True, True]


#: celery-once and celery-singleton as their READMEs use them: a second identical call is
#: refused (QueueOnce) or answered with the first one's result (Singleton).
ONCE_AND_SINGLETON = """
import json, os, uuid
from celery import Celery
from celery_once import QueueOnce, AlreadyQueued
from celery_singleton import Singleton

REDIS = "redis://127.0.0.1:6379/15"
app = Celery("proj", broker=os.environ["BROKER"], set_as_current=True)
app.conf.ONCE = {"backend": "celery_once.backends.Redis",
                 "settings": {"url": REDIS, "default_timeout": 60}}
app.conf.singleton_backend_url = REDIS

@app.task(base=QueueOnce, name="proj.once")
def once(n):
    return n

@app.task(base=Singleton, name="proj.single")
def single(n):
    return n

token = uuid.uuid4().hex
first = once.delay(token)
try:
    once.delay(token)
    second = "sent"
except AlreadyQueued as exc:
    second = "AlreadyQueued"
other = once.delay(token + "x")
graceful = once.apply_async(args=(token,), once={"graceful": True})
a = single.delay(token)
b = single.delay(token)
c = single.delay(token + "x")
print(json.dumps({"once": [bool(first.id), second, bool(other.id), type(graceful).__name__],
                  "single": [a.id == b.id, a.id != c.id, type(b).__name__]}))
"""


@pytest.mark.slow
def test_celery_once_and_singleton_refuse_a_duplicate_as_on_celery(database_url: str) -> None:
    pytest.importorskip("celery_once")
    pytest.importorskip("celery_singleton")
    python = celery_python()
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    on_celery = run_script(ONCE_AND_SINGLETON, python, env={"BROKER": REDIS_URL})
    on_akadze = run_script(ONCE_AND_SINGLETON, sys.executable, env={"BROKER": database_url})
    assert on_akadze == on_celery
    assert on_akadze["once"][1] == "AlreadyQueued" and on_akadze["single"][0] is True


#: A project whose boot steps connect a task signal receiver (weakly, on an object the step
#: holds, as django-structlog's step does) and record where they start and stop.
STEPS_PROJECT = '''
import os

import observe
from celery import Celery, bootsteps, signals

app = Celery("proj", broker=os.environ["PROJ_BROKER"],
             backend=os.environ.get("PROJ_BACKEND") or None)
app.conf.task_default_queue = os.environ["PROJ_QUEUE"]


class Receiver:
    def prerun(self, task=None, **kwargs):
        observe.emit({"kind": "prerun", "task": task.name})


class ConnectsReceivers(bootsteps.Step):
    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self.receiver = Receiver()
        signals.task_prerun.connect(self.receiver.prerun)


class StartsAndStops(bootsteps.StartStopStep):
    def start(self, worker):
        observe.emit({"kind": "start"})

    def stop(self, worker):
        observe.emit({"kind": "stop"})


app.steps["worker"].add(ConnectsReceivers)
app.steps["worker"].add(StartsAndStops)


@app.task(name="proj.double")
def double(x):
    return x * 2


@app.task(name="proj.boom")
def boom():
    raise ValueError("boom from the task")
'''

STEPS_OBSERVE = '''
import contextlib


def producer_span():
    return contextlib.nullcontext()


def producer_facts():
    return {}


def finish():
    pass
'''


def _step_facts(run: Any) -> dict[str, Any]:
    def where(record: dict[str, Any]) -> str:
        return "worker" if record["pid"] == run.worker_pid else "child"

    return {"producer": (run.producer["value"], run.producer["error"]),
            "prerun": sorted((record["task"], where(record)) for record in run.of("prerun")),
            "start": [where(record) for record in run.of("start")],
            "stop": [where(record) for record in run.of("stop")]}


STEP_FACTS = {"producer": (42, "ValueError"),
              # The step's receivers are where the tasks run: in the prefork child.
              "prerun": [("proj.boom", "child"), ("proj.double", "child")],
              # Started and stopped once, by the worker process.
              "start": ["worker"], "stop": ["worker"]}


@pytest.mark.slow
def test_steps_set_up_the_prefork_children_as_on_celery(tmp_path: Path,
                                                        module_database_url: str) -> None:
    from tests.addons.harness import celery_side_python, run_project

    files = {"proj.py": STEPS_PROJECT}
    assert _step_facts(run_project(tmp_path, "akadze", STEPS_OBSERVE,
                                   database_url=module_database_url, files=files)) == STEP_FACTS
    python = celery_side_python()
    assert _step_facts(run_project(tmp_path, "celery", STEPS_OBSERVE, celery=python,
                                   files=files)) == STEP_FACTS
