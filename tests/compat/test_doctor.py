"""``akadze-compat doctor``: the support tables against the code, the source scanner on small
sources, and the real command on the sample projects (no database involved)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import akadze_compat
from akadze_compat import signals
from akadze_compat.app.defaults import DEFAULTS
from akadze_compat.app.task import EXEC_OPTIONS, Task
from akadze_compat.doctor_scan import exists_in_facade, scan_source
from akadze_compat.support import (
    API_PATTERNS,
    DIFFERENT,
    HONOURED,
    IGNORED,
    MISSING,
    SETTING_SUPPORT,
    SIGNAL_SUPPORT,
    TASK_OPTION_SUPPORT,
    setting_value_support,
)
from tests.compat.cli_harness import DJANGO_PROJECT, PROJECTS, environment, error_lines, run

PACKAGE = Path(akadze_compat.__file__).parent
#: Where the facade's behaviour is, as opposed to where it is described.
CODE_FILES = [path for path in sorted(PACKAGE.rglob("*.py"))
              if path.name not in ("defaults.py", "support.py", "doctor.py", "doctor_scan.py")]
#: "different" settings whose note describes what is always done instead of reading them.
NOT_READ = {"result_extended", "result_serializer"}
#: Unreachable on purpose: the doctor must never connect.
NO_DATABASE = "postgresql://doc:Doct0r-pw@127.0.0.1:1/nowhere"


# --- the tables against the code ---------------------------------------------------------------

def test_every_celery_setting_is_classified() -> None:
    assert set(SETTING_SUPPORT) == set(DEFAULTS)
    for name, support in SETTING_SUPPORT.items():
        assert support.status in (HONOURED, DIFFERENT, IGNORED), name
        assert support.status == HONOURED or support.note, name


def test_every_setting_called_honoured_is_read_by_the_code() -> None:
    source = "\n".join(path.read_text("utf-8") for path in CODE_FILES)
    unread = [name for name, support in SETTING_SUPPORT.items()
              if support.status != IGNORED and name not in NOT_READ
              and not re.search(rf"\b{name}\b", source)]
    assert unread == []


def test_signals_called_sent_are_exactly_the_ones_sent() -> None:
    every = {name for name, value in vars(signals).items()
             if isinstance(value, signals.Signal)}
    app_signals = {"app.on_configure", "app.on_after_configure", "app.on_after_finalize",
                   "app.on_after_fork"}
    assert set(SIGNAL_SUPPORT) == every | app_signals
    sent = set()
    for path in CODE_FILES:
        text = path.read_text("utf-8")
        sent.update(re.findall(r"signals\.(\w+)\.send\(", text))
        sent.update(f"app.{name}" for name in re.findall(r"self\.(on_\w+)\.send\(", text))
    called_sent = {name for name, support in SIGNAL_SUPPORT.items()
                   if support.status in (HONOURED, DIFFERENT)}
    assert called_sent == sent


def test_task_options_and_api_patterns_are_well_formed() -> None:
    for option in TASK_OPTION_SUPPORT:
        assert hasattr(Task, option) or option in EXEC_OPTIONS, option
    assert {support.status for support in TASK_OPTION_SUPPORT.values()} <= {DIFFERENT, IGNORED}
    assert {support.status for support in API_PATTERNS.values()} == {MISSING, DIFFERENT}


def test_refused_setting_values_are_missing() -> None:
    assert setting_value_support("accept_content", ["pickle", "json"]).status == MISSING
    assert setting_value_support("accept_content", ["application/json"]) is None
    assert setting_value_support("task_serializer", "yaml").status == MISSING
    assert setting_value_support("broker_url", "amqp://guest@rabbit//").status == MISSING
    assert setting_value_support("broker_url", "postgresql://h/db") is None
    assert setting_value_support(
        "beat_scheduler", "django_celery_beat.schedulers:DatabaseScheduler").status == DIFFERENT
    assert setting_value_support("beat_scheduler", "django").status == DIFFERENT
    assert setting_value_support("beat_scheduler", "redbeat.RedBeatScheduler").status == MISSING
    assert setting_value_support("worker_pool", "gevent").status == DIFFERENT
    assert setting_value_support("worker_pool", "threads") is None


# --- the scanner -------------------------------------------------------------------------------

def scan(source: str, **options: Any) -> list[tuple[str, int]]:
    return [(use.pattern, use.line) for use in scan_source(textwrap.dedent(source), **options)]


def test_canvas_is_found_however_it_is_imported() -> None:
    found = scan("""\
        from akadze_compat import group, shared_task
        from akadze_compat.canvas import chord as together
        import akadze_compat as celery

        @shared_task
        def add(x, y):
            return x + y

        group(add.s(i, i) for i in range(3))()
        together([add.s(1, 1)], add.s())
        celery.chain(add.s(1, 2), add.s(3))
        (add.s(1, 2) | add.s(3)).delay()
        add.chunks(zip(range(9), range(9)), 3)
        group.from_dict({})
        """)
    assert found == [("celery.group", 1), ("celery.chord", 2), ("celery.group", 9),
                     ("celery.chord", 10), ("celery.chain", 11),
                     ("signature | signature", 12),
                     ("Task.map / Task.starmap / Task.chunks", 13), ("celery.group", 14)]


def test_a_consumer_step_is_found_as_missing() -> None:
    """It imports (the worker refuses to start with it), so the scan names it itself."""
    found = scan("""\
        from akadze_compat import bootsteps
        from akadze_compat.bootsteps import ConsumerStep, StartStopStep

        class Mine(bootsteps.ConsumerStep):
            pass
        """)
    assert found == [("celery.bootsteps.ConsumerStep", 2), ("celery.bootsteps.ConsumerStep", 4)]
    assert API_PATTERNS["celery.bootsteps.ConsumerStep"].status == MISSING


def test_names_akadze_compat_lacks_and_celery_imports() -> None:
    found = scan("""\
        import celery
        from celery.result import AsyncResult
        from akadze_compat.contrib.rdb import set_trace
        from akadze_compat.result import GroupResult, AsyncResult
        from akadze_compat.app.task import Task
        from akadze_compat.exceptions import Retry, Ignore
        from akadze_compat.utils.log import get_task_logger
        from akadze_compat.schedules import crontab, solar
        from akadze_compat.app.amqp import Queues
        """)
    # Line 5: akadze_compat.app.task exists (Celery's module path); line 9 does not.
    assert scan("from akadze_compat.contrib.abortable import AbortableTask\n") == []
    assert found == [("import celery", 1), ("import celery", 2), ("celery.contrib", 3),
                     ("celery.result.GroupResult", 4), ("celery.schedules.solar", 8),
                     ("unavailable name", 9)]
    assert exists_in_facade("celery.exceptions.SoftTimeLimitExceeded")
    assert not exists_in_facade("celery.beat.PersistentScheduler")


def test_control_results_and_options() -> None:
    found = scan("""\
        import gc
        import os
        from akadze_compat.result import AsyncResult

        def f(app, add, text):
            app.control.inspect().active()
            app.control.autoscale(10, 3)
            app.control.revoke("1")
            app.control.revoke("1", terminate=True)
            result = add.delay(1)
            result.then(print)
            AsyncResult("1").collect()
            result.forget()
            gc.collect()
            os.link("a", "b")
            text.replace("a", "b")
            add.apply_async((1,), link=add.s(), priority=3, serializer="pickle")
            add.apply_async((1,), serializer="json")
        """)
    assert found == [("app.control.inspect", 6), ("app.control.*", 7),
                     ("revoke(terminate=True)", 9),
                     ("AsyncResult.then / collect / build_graph", 11),
                     ("AsyncResult.then / collect / build_graph", 12),
                     ("AsyncResult.forget", 13), ("link / link_error", 17), ("priority=", 17),
                     ("serializer=", 17)]


def test_bound_tasks_and_task_classes() -> None:
    found = scan("""\
        from akadze_compat import Task
        from proj.celery import app

        @app.task(bind=True)
        def bound(self, x):
            queue = self.request.delivery_info["queue"]
            self.update_state(state="PROGRESS")
            self.update_state("other-id", "PROGRESS")
            if self.request.chain:
                raise self.replace(x)
            return self.app.events

        @app.task
        def unbound(self):
            return self.replace("a", "b")

        class Base(Task):
            def on_success(self, retval, task_id, args, kwargs):
                self.send_event("task-custom")
        """, module="proj.tasks", app_refs={("proj.celery", "app")})
    assert found == [("request.delivery_info", 6), ("update_state(task_id=...)", 8),
                     ("request.chain / chord / group", 9), ("Task.replace", 10),
                     ("app.*", 11), ("Task.send_event", 19)]


def test_the_app_is_known_by_its_references_only() -> None:
    source = """\
        from akadze_compat import Celery
        from flask import Flask
        from .celery import app as celery_app

        web = Flask(__name__)
        queue_app = Celery("proj")
        web.route("/")
        queue_app.pool.connection
        celery_app.events.State()
        celery_app.conf.task_default_queue
        """
    found = scan(source, module="proj.views", app_refs={("proj.celery", "app")})
    assert found == [("app.*", 8), ("app.*", 9)]
    # A package's __init__ resolves relative imports from the package itself.
    found = scan(source, module="proj.__init__", app_refs={("proj.celery", "app")})
    assert ("app.*", 9) in found


# --- the command on the sample projects ------------------------------------------------------

def doctor(*args: str, cwd: Path = PROJECTS) -> tuple[int, dict[str, Any], str]:
    done = run("-b", NO_DATABASE, *args, "doctor", "--json", cwd=cwd)
    assert error_lines(done.stderr) == [], done.stderr
    return done.returncode, json.loads(done.stdout), done.stdout


def findings(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(item["section"], item["key"]): item for item in report["findings"]}


def test_plainproj_has_nothing_blocking() -> None:
    code, report, _ = doctor("-A", "plainproj")
    assert code == 0 and report["exit_code"] == 0
    queues = {task["name"]: task["queue"] for task in report["tasks"]}
    assert queues["plainproj.billing.tasks.charge"] == "hipri"
    assert queues["plainproj.reports.tasks.build_report"] == "lopri"
    assert queues["plainproj.billing.tasks.add"] == "celery"
    options = {task["name"]: task["options"] for task in report["tasks"]}
    assert options["plainproj.billing.tasks.charge"] == {"max_retries": "5",
                                                         "default_retry_delay": "30"}
    assert {key: item["kind"] for key, item in findings(report).items()} == {
        ("settings", "result_backend"): "ignored",
        ("settings", "task_acks_late"): "different",
        ("api", "request.delivery_info"): "different",
        ("task options", "time_limit"): "different",  # reports.tasks.flaky's hard limit
    }
    # worker_prefetch_multiplier = 1 is honoured (prefork), so not reported.
    assert report["summary"] == {"missing": 0, "different": 3, "ignored": 1, "unknown": 0}


def test_djangoproj_reads_the_celery_namespace() -> None:
    code, report, _ = doctor("-A", "djangoproj", cwd=DJANGO_PROJECT)
    assert code == 0
    assert {task["name"]: task["queue"] for task in report["tasks"]} == {
        "djangoproj.celery.debug_task": "django", "shop.tasks.process_order": "orders",
        "shop.tasks.send_receipt": "django"}
    found = findings(report)
    assert found[("settings", "task_time_limit")]["subject"] == "CELERY_TASK_TIME_LIMIT"
    assert found[("settings", "task_time_limit")]["kind"] == "different"
    assert found[("settings", "result_backend")]["value"] == "'django-db'"
    assert found[("task options", "ignore_result")]["where"] == [
        "djangoproj.celery.debug_task (True)"]
    # Django's own settings (SECRET_KEY, DATABASES...) are not Celery's business.
    assert not [item for item in report["findings"] if item["kind"] == "unknown"]


def test_legacyproj_gets_every_problem_reported_and_exit_1() -> None:
    code, report, stdout = doctor("-A", "legacyproj")
    assert code == 1 and report["exit_code"] == 1
    kinds = {key: item["kind"] for key, item in findings(report).items()}
    assert kinds == {
        ("settings", "accept_content"): "missing",
        ("settings", "worker_max_memory_per_child"): "ignored",
        ("settings", "result_backend"): "ignored",
        ("settings", "CELERY_TASK_ACK_LATE"): "unknown",
        ("periodic tasks", "beat_schedule"): "ignored",
        ("task options", "serializer"): "missing",
        ("task options", "priority"): "different",
        ("task options", "time_limit"): "different",
        ("task options", "soft_time_limit"): "different",
        ("task options", "acks_late"): "ignored",
        ("task options", "rate_limit"): "different",
        ("task options", "reject_on_worker_lost"): "ignored",
        ("signals", "task_received"): "different",
        ("signals", "heartbeat_sent"): "missing",
        ("api", "app.control.*"): "missing",
        ("api", "app.control.inspect"): "different",
        # Canvas runs, with the differences the guide lists.
        ("api", "celery.chain"): "different",
        ("api", "celery.group"): "different",
        ("api", "celery.result.GroupResult"): "different",
        ("api", "signature | signature"): "different",
        ("api", "request.delivery_info"): "different",
    }
    found = findings(report)
    assert found[("settings", "worker_max_memory_per_child")]["subject"] == \
        "CELERYD_MAX_MEMORY_PER_CHILD"
    assert "CELERY_ACKS_LATE" in found[("settings", "CELERY_TASK_ACK_LATE")]["message"]
    # CELERY_ANNOTATIONS sets it over the decorator's 10/m, as on Celery.
    assert found[("task options", "rate_limit")]["where"] == [
        "legacyproj.orders.tasks.fetch_rates ('10/s')"]
    # The async task's time limit is exact: only the plain def one is reported.
    assert found[("task options", "time_limit")]["where"] == [
        "legacyproj.orders.tasks.settle (30)"]
    assert found[("signals", "task_received")]["where"] == ["legacyproj.celery.count_received"]
    assert found[("api", "celery.group")]["where"] == ["legacyproj/orders/tasks.py:3, 35"]
    assert found[("periodic tasks", "beat_schedule")]["subject"] == "nightly-report"
    # maintenance.py's AbortableTask is provided now (akadze_compat.contrib.abortable);
    # app.control.inspect() and task_received are, differently.
    assert report["summary"] == {"missing": 4, "different": 11, "ignored": 5, "unknown": 1}
    # Passwords: the result backend's and the -b URL's are never shown.
    assert "legacy-s3cret" not in stdout and "Doct0r-pw" not in stdout
    assert found[("settings", "result_backend")]["value"] == "'redis://:***@localhost:6379/0'"


def test_text_report() -> None:
    done = run("-A", "legacyproj", "doctor")
    assert done.returncode == 1
    out = done.stdout
    assert out.startswith("akadze-compat doctor: app legacyproj (config "
                          "legacyproj.celeryconfig; 5 tasks; 6 source files scanned)")
    assert "  legacyproj.orders.tasks.notify          async queue orders  time_limit=10" in out
    assert ("  [ignored] CELERYD_MAX_MEMORY_PER_CHILD (worker_max_memory_per_child) = 200000\n"
            "      not supported: use worker_max_tasks_per_child") in out
    assert ("  [different] task_received\n      legacyproj.celery.count_received\n"
            "      sent just before task_prerun") in out
    assert out.rstrip().endswith("Summary: 4 missing, 11 different, 5 ignored, 1 unknown: "
                                 "something the project uses is missing in akadze (exit 1)")
    assert "legacy-s3cret" not in out


def test_errors_are_one_line() -> None:
    done = run("doctor")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "akadze-compat: error: no app given: name it with -A, e.g. akadze-compat -A proj worker"]
    done = run("-A", "nosuchproj", "doctor")
    assert done.returncode == 1 and len(error_lines(done.stderr)) == 1


def test_a_project_still_on_celery_runs_unchanged_under_the_alias(tmp_path: Path) -> None:
    package = tmp_path / "oldproj"
    package.mkdir()
    (package / "__init__.py").write_text("from celery import Celery\napp = Celery('old')\n")
    done = run("-A", "oldproj", "doctor", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [finding] = [item for item in report["findings"] if item["key"] == "import celery"]
    assert finding["kind"] == "different" and "celery alias" in finding["message"]


def test_with_the_alias_refused_a_project_on_celery_fails_in_one_line(tmp_path: Path) -> None:
    package = tmp_path / "oldproj"
    package.mkdir()
    (package / "__init__.py").write_text("from celery import Celery\napp = Celery('old')\n")
    done = run("-A", "oldproj", "doctor", cwd=tmp_path, env={"AKADZE_CELERY": "0"})
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    if importlib.util.find_spec("celery") is None:
        assert "No module named 'celery'" in line
        assert "replace `celery` with `akadze_compat` in its imports first" in line


@pytest.mark.parametrize("args", [("--help",), ("doctor", "--help")])
def test_help(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert done.returncode == 0 and "doctor" in done.stdout


def test_task_options_nothing_reads_are_reported() -> None:
    """An ``@app.task`` option akadze's Task does not know (a typo, Celery's ``Request``)
    is reported as ignored, instead of passing as "nothing blocks the move"; options a
    custom base class declares, and pydantic's (consumed by the decorator), are not."""
    from akadze_compat import Celery, Task
    from akadze_compat.doctor import _tasks

    class Base(Task):
        audit = False

    app = Celery("unknowns", set_as_current=False)

    @app.task(name="u.typo", max_retry=3, Request="proj.MyRequest")
    def typo() -> None: ...

    @app.task(name="u.fine", base=Base, audit=True, pydantic=True, max_retries=2)
    def fine() -> None: ...

    _, found = _tasks(app)
    reported = {finding.subject: (finding.kind, finding.where) for finding in found}
    assert reported == {"max_retry": ("ignored", ["u.typo (3)"]),
                        "Request": ("ignored", ["u.typo ('proj.MyRequest')"])}


TUTORIAL = """\
from akadze_compat import Celery

app = Celery("tasks", broker="{url}")
app.conf.update(task_default_queue="celery")


@app.task
def add(x, y):
    return x + y
{extra}

if __name__ == "__main__":
    app.start()
"""


def test_celery_tutorials_app_start_passes_and_runs_the_command(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(TUTORIAL.format(url=NO_DATABASE, extra=""))
    code, report, _ = doctor("-A", "tasks", cwd=tmp_path)
    assert (code, report["findings"]) == (0, [])
    # `python tasks.py doctor`: app.start() runs the command line for its own app.
    done = subprocess.run([sys.executable, "tasks.py", "doctor", "--json"], cwd=tmp_path,
                          env=environment(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [task["name"] for task in json.loads(done.stdout)["tasks"]] == ["tasks.add"]
    # A failing command exits with its code, as the command does.
    done = subprocess.run([sys.executable, "tasks.py", "nosuchcommand"], cwd=tmp_path,
                          env=environment(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "No such command 'nosuchcommand'" in done.stderr
    # From a program: the command runs to its end and start() returns.
    (tmp_path / "run.py").write_text("import tasks\ntasks.app.start(['doctor'])\n"
                                     "print('returned')\n")
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "nothing blocks the move (exit 0)\nreturned\n" in done.stdout


def test_worker_main_requires_the_worker_command() -> None:
    app = akadze_compat.Celery("wm", set_as_current=False)
    with pytest.raises(ValueError, match="worker sub-command must be specified"):
        app.worker_main(["inspect", "ping"])


def test_an_app_attribute_akadze_lacks_is_named(tmp_path: Path) -> None:
    extra = ("\n\ndef f():\n    app.pool.connection\n    app.events.State()\n"
             "    app.events.State()\n")
    (tmp_path / "tasks.py").write_text(TUTORIAL.format(url=NO_DATABASE, extra=extra))
    code, report, _ = doctor("-A", "tasks", cwd=tmp_path)
    named = sorted((item["key"], item["subject"], item["where"]) for item in report["findings"])
    assert code == 1 and named == [("app.*", "app.events", ["tasks.py:14, 15"]),
                                   ("app.*", "app.pool", ["tasks.py:13"])]
    done = run("-b", NO_DATABASE, "-A", "tasks", "doctor", cwd=tmp_path)
    assert "[missing] app.events\n" in done.stdout and "[missing] app.pool\n" in done.stdout
    assert done.stdout.rstrip().endswith("(exit 1)") and done.returncode == 1
