"""The celery alias: ``import celery`` resolves to akadze_compat when switched on
(``AKADZE_CELERY=1``, ``import akadze_compat.as_celery``, the ``akadze-compat`` command),
through the import system, winning over the real celery that the add-ons' pins install
beside akadze; with the switch off the real one imports untouched.

Each case runs in a fresh interpreter: the switch acts at interpreter start and for the rest
of the process, and the test process itself must keep the real celery.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, alias: str | None = None, python: str = sys.executable,
               cwd: Path | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with ``AKADZE_CELERY`` set to ``alias`` (None:
    unset); the code prints one JSON object as its last line, returned here."""
    env = {key: value for key, value in os.environ.items() if key != "AKADZE_CELERY"}
    if alias is not None:
        env["AKADZE_CELERY"] = alias
    completed = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True,
                               text=True, env=env, cwd=cwd or ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def real_celery_installed() -> bool:
    probe = run_python("""
        import importlib.util, json
        spec = importlib.util.find_spec("celery")
        print(json.dumps(spec is not None and "site-packages" in (spec.origin or "")))
    """)
    return bool(probe)


WHAT_CELERY_IS = """
    import json, sys
    import celery
    print(json.dumps({"name": celery.__spec__.name, "file": celery.__file__,
                      "version": celery.__version__,
                      "akadze_loaded": "akadze_compat" in sys.modules}))
"""


def test_switched_on_by_the_environment_celery_is_akadze_compat() -> None:
    seen = run_python("""
        import json, sys
        import celery, celery.app.task, celery.exceptions
        from celery import Celery, Task, shared_task
        from celery.app.task import Task as DeepTask
        import akadze_compat, akadze_compat.app.task, akadze_compat.exceptions
        import billiard, billiard.einfo, billiard.exceptions
        from akadze_compat.app.trace import ExceptionInfo
        print(json.dumps({
            "same_package": celery is akadze_compat,
            "same_submodule": celery.app.task is akadze_compat.app.task,
            "registered": sys.modules["celery.app.task"] is sys.modules["akadze_compat.app.task"],
            "same_classes": Celery is akadze_compat.Celery and Task is DeepTask
                            and Task is akadze_compat.Task,
            "spec_kept": [celery.__spec__.name, celery.app.task.__spec__.name],
            "version": [celery.__version__, list(celery.VERSION), celery.version_info.major,
                        celery.VERSION_BANNER],
            "time_limits": [billiard.exceptions.SoftTimeLimitExceeded
                            is celery.exceptions.SoftTimeLimitExceeded,
                            billiard.exceptions.TimeLimitExceeded
                            is celery.exceptions.TimeLimitExceeded],
            "einfo": billiard.einfo.ExceptionInfo is ExceptionInfo,
            "billiard_version": list(billiard.VERSION),
        }))
    """, alias="1")
    assert seen == {
        "same_package": True, "same_submodule": True, "registered": True,
        "same_classes": True,
        "spec_kept": ["akadze_compat", "akadze_compat.app.task"],
        "version": ["5.7.0", [5, 7, 0, "", ""], 5, "5.7.0 (collider)"],
        "time_limits": [True, True], "einfo": True, "billiard_version": [4, 3, 2, ""],
    }


def test_the_version_is_the_one_celery_reports() -> None:
    celery_python = os.environ.get("CELERY_PYTHON", "/tmp/akadze-celery-venv/bin/python")
    if not Path(celery_python).exists():
        pytest.skip(f"no Celery interpreter at {celery_python} (CELERY_PYTHON)")
    code = """
        import json, celery
        print(json.dumps([celery.__version__, list(celery.VERSION), celery.SERIES,
                          celery.VERSION_BANNER, list(celery.version_info_t._fields)]))
    """
    assert run_python(code, alias="1") == run_python(code, python=celery_python)


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_switched_off_the_real_celery_imports_untouched(value: str | None) -> None:
    if not real_celery_installed():
        pytest.skip("no real celery installed beside akadze (the test extra pins it)")
    seen = run_python(WHAT_CELERY_IS, alias=value)
    assert seen["name"] == "celery"
    assert "site-packages" in seen["file"]
    assert not seen["akadze_loaded"]  # the .pth file imports nothing when off


@pytest.mark.parametrize("value", ["1", "true", "yes", "ON"])
def test_switched_on_it_wins_over_the_real_celery(value: str) -> None:
    if not real_celery_installed():
        pytest.skip("no real celery installed beside akadze (the test extra pins it)")
    seen = run_python(WHAT_CELERY_IS, alias=value)
    assert seen["name"] == "akadze_compat"
    assert seen["file"].startswith(str(ROOT / "akadze_compat"))


def test_a_first_line_import_switches_it_on_for_the_process_and_its_children() -> None:
    seen = run_python("""
        import akadze_compat.as_celery
        import json, os, subprocess, sys
        import celery
        child = subprocess.run([sys.executable, "-c", "import celery; print(celery.__spec__.name)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        print(json.dumps([celery.__spec__.name, os.environ["AKADZE_CELERY"], child]))
    """)
    assert seen == ["akadze_compat", "1", "akadze_compat"]


def test_install_is_idempotent_and_first_in_meta_path() -> None:
    seen = run_python("""
        import json, sys
        from akadze_compat import as_celery
        from akadze_compat._alias import AliasFinder
        as_celery.install(); as_celery.install()
        finders = [f for f in sys.meta_path if isinstance(f, AliasFinder)]
        print(json.dumps([len(finders), isinstance(sys.meta_path[0], AliasFinder),
                          as_celery.installed()]))
    """)
    assert seen == [1, True, True]


def test_a_real_celery_imported_before_the_switch_is_replaced() -> None:
    if not real_celery_installed():
        pytest.skip("no real celery installed beside akadze (the test extra pins it)")
    seen = run_python("""
        import json, sys
        import celery as before, celery.app.task
        import akadze_compat.as_celery
        import celery as after
        from celery.app.task import Task
        import akadze_compat
        print(json.dumps([before.__spec__.name, after.__spec__.name,
                          Task is akadze_compat.Task,
                          sorted({m.__spec__.name.split(".")[0] for n, m in sys.modules.items()
                                  if n == "celery" or n.startswith("celery.")})]))
    """)
    assert seen == ["celery", "akadze_compat", True, ["akadze_compat"]]


def test_a_celery_module_akadze_lacks_is_missing_not_the_real_ones() -> None:
    if not real_celery_installed():
        pytest.skip("no real celery installed beside akadze (the test extra pins it)")
    seen = run_python("""
        import importlib.util, json
        try:
            import celery.concurrency.eventlet
        except ModuleNotFoundError as exc:
            error = exc.name
        try:
            import billiard.connection
        except ModuleNotFoundError as exc:
            billiard_error = exc.name
        print(json.dumps([error, billiard_error,
                          importlib.util.find_spec("celery.no_such_module") is None]))
    """, alias="1")
    assert seen == ["celery.concurrency", "billiard.connection", True]


def test_module_name_import_hooks_see_the_celery_names() -> None:
    # Agents that patch a module after it is imported put a finder in front of the others
    # and chain to them (New Relic's, ddtrace's, wrapt's): they must see the celery name of
    # a module loaded after they start, whichever name it is imported by.
    seen = run_python("""
        import importlib.abc, importlib.util, json, sys

        class Watcher(importlib.abc.MetaPathFinder):
            seen = []
            busy = set()

            def find_spec(self, fullname, path=None, target=None):
                if fullname in self.busy or not fullname.startswith(("celery", "billiard")):
                    return None
                self.busy.add(fullname)
                try:
                    spec = importlib.util.find_spec(fullname)
                finally:
                    self.busy.discard(fullname)
                if spec is not None:
                    self.seen.append(fullname)
                return spec

        loaded_before = "celery.app.trace" in sys.modules and "celery.platforms" in sys.modules
        sys.meta_path.insert(0, Watcher())
        import akadze_compat.platforms  # as akadze's own code imports it
        import celery.contrib.abortable  # as a project imports it
        import akadze_compat
        print(json.dumps([loaded_before, Watcher.seen,
                          sys.modules["celery.platforms"] is akadze_compat.platforms,
                          celery.contrib.abortable.__spec__.name]))
    """, alias="1")
    assert seen == [False, ["celery.platforms", "celery.contrib", "celery.contrib.abortable"],
                    True, "akadze_compat.contrib.abortable"]


def test_every_loaded_akadze_module_has_its_celery_name() -> None:
    seen = run_python("""
        import json, sys
        import akadze_compat.as_celery
        missing = [name for name in list(sys.modules)
                   if name.startswith("akadze_compat") and ("._" not in name
                                                            or "._state" in name)
                   and "celery" + name[len("akadze_compat"):] not in sys.modules]
        import akadze_compat._billiard.einfo
        print(json.dumps([missing, sys.modules["celery.app.trace"].__name__,
                          sys.modules["billiard.einfo"] is akadze_compat._billiard.einfo,
                          akadze_compat._billiard.einfo.__name__]))
    """)
    assert seen == [[], "akadze_compat.app.trace", True, "akadze_compat._billiard.einfo"]


def test_new_relic_and_wrapt_post_import_hooks_fire_on_akadze_modules() -> None:
    pytest.importorskip("newrelic")
    pytest.importorskip("wrapt")
    seen = run_python("""
        import json, sys
        import wrapt
        from newrelic.api.import_hook import ImportHookFinder, register_import_hook
        sys.meta_path.insert(0, ImportHookFinder())  # as the agent's start does
        fired = {}

        def record(key):
            return lambda module: fired.setdefault(key, module.__spec__.name)

        # Loaded already (the worker's modules are): the hooks run at once.
        register_import_hook("celery.app.task", record("newrelic loaded"))
        wrapt.register_post_import_hook(record("wrapt loaded"), "celery.app.trace")
        # Loaded later, by akadze's own import: the hooks run when it is.
        register_import_hook("celery.platforms", record("newrelic later"))
        wrapt.register_post_import_hook(record("wrapt later"), "celery.registry")
        import akadze_compat.platforms, akadze_compat.registry
        print(json.dumps(fired))
    """, alias="1")
    assert seen == {"newrelic loaded": "akadze_compat.app.task",
                    "wrapt loaded": "akadze_compat.app.trace",
                    "newrelic later": "akadze_compat.platforms",
                    "wrapt later": "akadze_compat.registry"}


def test_ddtrace_module_watchdog_hook_fires_on_akadze_modules() -> None:
    pytest.importorskip("ddtrace")
    seen = run_python("""
        import json
        from ddtrace.internal.module import ModuleWatchdog
        fired = []
        ModuleWatchdog.install()
        for name in ("celery.app.task", "celery.platforms"):
            ModuleWatchdog.register_module_hook(
                name, lambda module: fired.append(module.__spec__.name))
        import akadze_compat.platforms
        print(json.dumps(fired))
    """, alias="1")
    assert seen == ["akadze_compat.app.task", "akadze_compat.platforms"]


# Imported by each add-on at import time (its own module, as its docs have the user import
# it); None: the module needs nothing more than the alias.
ADDON_MODULES = [
    "sentry_sdk.integrations.celery",
    "ddtrace.contrib.internal.celery.patch",
    "newrelic.hooks.application_celery",
    "opentelemetry.instrumentation.celery",
    "redbeat.schedulers",
    "celery_singleton",
    "celery_once",
    "django_structlog.celery.receivers",
]


@pytest.mark.parametrize("module", ADDON_MODULES)
def test_addon_modules_import_on_akadze(module: str) -> None:
    top = module.split(".")[0]
    pytest.importorskip(top)
    seen = run_python(f"""
        import importlib, json, sys
        importlib.import_module({module!r})
        homes = {{module.__spec__.name.split(".")[0]
                 for name, module in list(sys.modules.items())
                 if name.split(".")[0] in ("celery", "billiard")}}
        print(json.dumps([sys.modules["celery"].__spec__.name, sorted(homes)]))
    """, alias="1")
    assert seen[0] == "akadze_compat"
    assert set(seen[1]) <= {"akadze_compat"}


def test_the_names_addons_import_from_celery_modules() -> None:
    seen = run_python("""
        import json
        import celery
        from celery import registry
        from celery.app import app_or_default
        from celery.beat import DEFAULT_MAX_INTERVAL, ScheduleEntry, Scheduler
        from celery.utils import cached_property, get_full_cls_name
        from celery.utils.serialization import b64decode, b64encode
        from celery.utils.time import humanize_seconds
        from celery.platforms import close_open_fds
        from billiard.einfo import ExceptionWithTraceback
        from billiard.pool import Worker
        from billiard.process import current_process
        app = celery.Celery("proj", set_as_current=True)

        @app.task(name="proj.add")
        def add(x, y):
            return x + y

        print(json.dumps({
            "registry": registry.tasks.get("proj.add") is add,
            "app_or_default": [app_or_default() is app, app_or_default(app) is app],
            "beat": DEFAULT_MAX_INTERVAL,
            "full_name": get_full_cls_name(app),
            "b64": [b64encode("hé"), b64decode(b64encode(b"\\x00\\x01")).hex()],
            "humanize": [humanize_seconds(60), humanize_seconds(7200, prefix="in "),
                         humanize_seconds(0.5), humanize_seconds(0.5, microseconds=True)],
            "process": current_process().name,
        }))
    """, alias="1")
    assert seen == {
        "registry": True, "app_or_default": [True, True], "beat": 300,
        "full_name": "akadze_compat.app.base.Celery",
        "b64": ["aMOp", "0001"],
        "humanize": ["1.00 minute", "in 2.00 hours", "now", "0.50 seconds"],
        "process": "MainProcess",
    }


def test_helper_values_match_celery() -> None:
    celery_python = os.environ.get("CELERY_PYTHON", "/tmp/akadze-celery-venv/bin/python")
    if not Path(celery_python).exists():
        pytest.skip(f"no Celery interpreter at {celery_python} (CELERY_PYTHON)")
    code = """
        import json
        from celery.utils.time import humanize_seconds
        from celery.utils.serialization import b64encode, b64decode
        from celery.utils import get_full_cls_name
        from celery.beat import DEFAULT_MAX_INTERVAL
        class Outer:
            class Inner: pass
        print(json.dumps([[humanize_seconds(s, prefix=p, microseconds=m)
                           for s in (0, 0.004, 0.5, 1, 59.999, 60, 61.5, 3600, 86400, 200000)
                           for p in ("", "in ") for m in (False, True)],
                          b64encode("x\\u00e9"), b64decode("eMOp").decode(),
                          get_full_cls_name(Outer), get_full_cls_name(Outer.Inner),
                          get_full_cls_name(json.dumps), DEFAULT_MAX_INTERVAL]))
    """
    assert run_python(code, alias="1") == run_python(code, python=celery_python)


def test_billiard_pool_worker_runs_through_methods_looked_up_at_call_time() -> None:
    seen = run_python("""
        import json
        from billiard.pool import Worker
        calls = []
        original_loop, original_exit = Worker.workloop, Worker._do_exit

        def workloop(self, *args, **kwargs):
            calls.append("workloop")
            return original_loop(self, *args, **kwargs)

        def do_exit(self, pid, exitcode, exc=None):
            calls.append(["_do_exit", exitcode])
            return original_exit(self, pid, exitcode, exc)

        Worker.workloop, Worker._do_exit = workloop, do_exit
        code = Worker(lambda: calls.append("loop") or 3, lambda pid, code: calls.append(
            ["on_exit", code]))()
        print(json.dumps([code, calls]))
    """, alias="1")
    assert seen == [3, ["workloop", "loop", ["_do_exit", 3], ["on_exit", 3]]]


def test_the_command_turns_the_alias_on_for_its_project() -> None:
    seen = run_python("""
        import json, os, sys
        sys.argv = ["akadze-compat", "--version"]
        from akadze_compat.bin.celery import main
        try:
            main()
        except SystemExit:
            pass
        import celery
        print(json.dumps([celery.__spec__.name, os.environ.get("AKADZE_CELERY")]))
    """)
    assert seen == ["akadze_compat", "1"]


def test_the_command_leaves_celery_alone_when_told_to() -> None:
    if not real_celery_installed():
        pytest.skip("no real celery installed beside akadze (the test extra pins it)")
    seen = run_python("""
        import json, sys
        sys.argv = ["akadze-compat", "--version"]
        from akadze_compat.bin.celery import main
        try:
            main()
        except SystemExit:
            pass
        import celery
        print(json.dumps(celery.__spec__.name))
    """, alias="0")
    assert seen == "celery"


def test_the_pth_file_is_installed_beside_the_package() -> None:
    # This checkout's own install (editable in development): the file Python reads at start.
    pth = Path(sysconfig.get_paths()["purelib"], "akadze-celery.pth")
    assert pth.is_file()
    assert "akadze_compat.as_celery" in pth.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wheel", "editable"])
def test_wheel_and_editable_installs_ship_the_switch(mode: str, tmp_path: Path) -> None:
    """A fresh virtualenv with akadze installed from a wheel, or with ``pip install -e``:
    ``AKADZE_CELERY=1`` switches the alias on at start, and nothing happens without it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    # akadze's dependencies come from this environment (a path line; its own .pth files,
    # akadze's editable finder among them, are not read), sorted before akadze's file.
    (purelib / "00-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"]
    if mode == "wheel":
        wheels = tmp_path / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "-w", str(wheels), str(ROOT)],
                       check=True, capture_output=True)
        subprocess.run([*pip, str(next(wheels.glob("akadze-*.whl")))], check=True,
                       capture_output=True)
    else:
        subprocess.run([*pip, "-e", str(ROOT)], check=True, capture_output=True)
    assert (purelib / "akadze-celery.pth").is_file()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    on = run_python(WHAT_CELERY_IS, alias="1", python=python, cwd=outside)
    assert on["name"] == "akadze_compat"
    expected_home = ROOT if mode == "editable" else purelib
    assert on["file"].startswith(str(expected_home / "akadze_compat"))
    if real_celery_installed():  # the scratch environment sees this one's packages
        off = run_python(WHAT_CELERY_IS, python=python, cwd=outside)
        assert off["name"] == "celery"
        assert not off["akadze_loaded"]
