"""The README cannot drift: its quickstarts run as written, in a new directory, on a fresh
database and on the embedded Postgres.

Each quickstart is a ```python block whose first line names its file (``# tasks.py: ...``)
and a ```sh block: what comes before ``# in another terminal:`` is the worker (started,
left running), what comes after is the client, which must print the expected result. The
commands are the installed console scripts where they exist (.ci/run installs the project);
otherwise small shims on PATH run the same entry points from this checkout. The code blocks
of docs/ run in test_docs.py, with the helpers of this module.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
README = PROJECT_ROOT / "README.md"
ANOTHER_TERMINAL = "# in another terminal:"

pytestmark = pytest.mark.slow


def section(title: str, document: Path = README) -> str:
    """The text of the section headed ``## title`` of ``document`` (the README by default),
    up to the next ``## `` heading or the end of the file."""
    text = document.read_text("utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text,
                      re.MULTILINE | re.DOTALL)
    assert match, f"{document.name} has no section {title!r}"
    return match.group(1)


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in ``text``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def shims(directory: Path) -> Path:
    """A bin directory whose python3/akadze/akadze-compat are this test's interpreter and
    the project's console scripts (or their ``-m`` entry points, when not installed)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    scripts = {"python3": [sys.executable]}
    for name, module in (("akadze", "akadze_core.cli.main"), ("akadze-compat", "akadze_compat")):
        installed = Path(sys.executable).with_name(name)
        scripts[name] = [str(installed)] if installed.exists() else [sys.executable, "-m", module]
    for name, argv in scripts.items():
        shim = bin_dir / name
        shim.write_text("#!/bin/sh\nexec " + " ".join(f"'{part}'" for part in argv) + ' "$@"\n')
        shim.chmod(0o755)
    return bin_dir


def environment(directory: Path, database_url: str | None) -> dict[str, str]:
    """A newcomer's environment: no database settings unless given, home in ``directory``
    (so the embedded Postgres and any per-user data stay in the test's directory)."""
    cleared = ("AKADZE_DATABASE_URL", "CELERY_BROKER_URL", "BROKER_URL", "AKADZE_HOME",
               "AKADZE_EMBEDDED_DIR", "XDG_DATA_HOME", "CELERY_CONFIG_MODULE")
    env = {key: value for key, value in os.environ.items() if key not in cleared}
    env["PATH"] = f"{shims(directory)}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(directory / "home")
    env["PYTHONUNBUFFERED"] = "1"
    # The project's modules from this checkout, the user's module from the current directory.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                      os.environ.get("PYTHONPATH")]))
    if database_url is not None:
        env["AKADZE_DATABASE_URL"] = database_url
    return env


def run_quickstart(title: str, directory: Path, database_url: str | None,
                   timeout: float = 120) -> str:
    """Write the section's module, start its worker, run its client; returns what the client
    printed. The worker is stopped with SIGTERM afterwards (its shell dies of the signal;
    the worker itself must log no traceback)."""
    text = section(title)
    module = blocks(text, "python")[0]
    filename = re.match(r"# (\w+\.py)", module)
    assert filename, f"the first python block of {title!r} does not name its file"
    (directory / filename.group(1)).write_text(module)
    commands = blocks(text, "sh")[0]
    assert ANOTHER_TERMINAL in commands, commands
    worker_part, client_part = commands.split(ANOTHER_TERMINAL)
    env = environment(directory, database_url)
    log = (directory / "worker.log").open("wb")
    worker = subprocess.Popen(["bash", "-c", worker_part], cwd=directory, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # The user starts the client once the worker says it is up, as the README's order
        # implies (before that, `migrate` may not have run yet).
        _wait_for_line(directory / "worker.log", READY, worker)
        client = subprocess.run(["bash", "-c", client_part], cwd=directory, env=env,
                                capture_output=True, text=True, timeout=timeout)
        worker_log = (directory / "worker.log").read_text("utf-8", errors="replace")
        assert client.returncode == 0, (
            f"client exited {client.returncode}\n{client.stderr[-4000:]}\n--- worker\n"
            f"{worker_log[-4000:]}")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        _wait_for_group_exit(worker.pid)
        log.close()
    worker_log = (directory / "worker.log").read_text("utf-8", errors="replace")
    assert "Traceback" not in worker_log, worker_log
    return client.stdout


#: The line each worker logs once it claims: the core's "started: queues", Celery's "ready.".
READY = re.compile(r"\bstarted: queues\b| ready\.$", re.MULTILINE)


def _wait_for_line(path: Path, pattern: re.Pattern[str], process: subprocess.Popen[bytes],
                   timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text("utf-8", errors="replace")
        if pattern.search(text):
            return
        if process.poll() is not None:
            raise AssertionError(f"the worker exited {process.returncode}:\n{text[-4000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the worker never said it was ready:\n{text[-4000:]}")


def _wait_for_group_exit(group: int, timeout: float = 30) -> None:
    """Wait until every process of ``group`` (the worker under its shell) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)
    raise AssertionError("the quickstart's worker did not stop on SIGTERM")


CELERY = "Quickstart for Celery users"
CORE = "Quickstart for core users"
CELERY_RESULT = "{'order': 42, 'charged': '9.90', 'retries': 0}"
CORE_RESULT = "export x fetched"


def test_the_celery_quickstart_on_a_fresh_database(tmp_path: Path,
                                                  empty_database_url: str) -> None:
    assert run_quickstart(CELERY, tmp_path, empty_database_url).strip() == CELERY_RESULT


def test_the_core_quickstart_on_a_fresh_database(tmp_path: Path,
                                                empty_database_url: str) -> None:
    assert run_quickstart(CORE, tmp_path, empty_database_url).strip() == CORE_RESULT


@pytest.fixture
def newcomer_directory() -> Iterator[Path]:
    """A new directory for the embedded Postgres's runs. Not under pytest's own temporary
    root: as root, pgserver runs Postgres as another user, which must traverse every parent,
    and each pytest session makes that root private again."""
    pytest.importorskip("pgserver")
    directory = Path(tempfile.mkdtemp(prefix="akadze-readme-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_the_celery_quickstart_on_the_embedded_postgres(newcomer_directory: Path) -> None:
    assert run_quickstart(CELERY, newcomer_directory, None).strip() == CELERY_RESULT


def test_the_core_quickstart_on_the_embedded_postgres(newcomer_directory: Path) -> None:
    assert run_quickstart(CORE, newcomer_directory, None).strip() == CORE_RESULT
