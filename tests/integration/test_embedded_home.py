"""Where the embedded Postgres lives: one database per project, wherever a process starts.

The rule (``akadze_core.store.embedded``): ``$AKADZE_HOME``, else ``.akadze/`` of the project root
found upwards from the current directory, else the per-user data directory. Commands that
only read never create a database. The processes run as a user runs them (subprocesses,
without ``AKADZE_DATABASE_URL``), with HOME and XDG_DATA_HOME in the test's directory so
that nothing lands in the real per-user directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from akadze_core.store.embedded import PROJECT_MARKERS, embedded_home
from tests.helpers import wait_for

PROJECT_ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.cli_app:app"
FAST = ["--poll-interval", "0.1", "--heartbeat-interval", "0.5", "--heartbeat-ttl", "5"]
LOCATION = "using the embedded Postgres in "
UNSET = ("AKADZE_DATABASE_URL", "AKADZE_HOME", "AKADZE_EMBEDDED_DIR", "CELERY_BROKER_URL",
         "BROKER_URL", "_AKADZE_EMBEDDED_ANNOUNCED")


def user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with no database configured, at home in ``tmp_path``."""
    env = {key: value for key, value in os.environ.items() if key not in UNSET}
    env["HOME"] = str(tmp_path / "home")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                      os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def project(tmp_path: Path) -> Path:
    """A project root (it has pyproject.toml) with a subdirectory two levels down."""
    root = tmp_path / "proj"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    return root


def no_root_above(path: Path) -> None:
    """Skip when a parent of the test's directory is itself a project (then no fallback)."""
    for directory in path.resolve().parents:
        if (directory / ".akadze").is_dir() or any(
                (directory / marker).exists() for marker in PROJECT_MARKERS):
            pytest.skip(f"{directory} looks like a project root")


def run(args: list[str], cwd: Path, env: dict[str, str],
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def akadze(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run(["-m", "akadze_core.cli", *args], cwd, env)


def created(tmp_path: Path) -> list[Path]:
    """Every ``.akadze`` or ``pgdata`` directory under ``tmp_path``."""
    return sorted(path for path in tmp_path.rglob("*")
                  if path.name in (".akadze", "pgdata", "akadze"))


# --- the rule --------------------------------------------------------------------------------

def test_the_project_root_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    root = project(tmp_path)
    env = user_env(tmp_path)
    home = embedded_home(root / "sub" / "deeper", env)
    assert home.directory == root.resolve() / ".akadze"
    assert home.pgdata == root.resolve() / ".akadze" / "pgdata"
    assert embedded_home(root, env) == home
    assert "pyproject.toml" in home.reason
    assert not home.exists()


@pytest.mark.parametrize("marker", ["setup.py", "setup.cfg", ".git"])
def test_each_marker_makes_a_root(tmp_path: Path, marker: str) -> None:
    (tmp_path / "app" / "pkg").mkdir(parents=True)
    (tmp_path / "app" / marker).touch()  # .git is a file in a git worktree
    home = embedded_home(tmp_path / "app" / "pkg", user_env(tmp_path))
    assert home.directory == (tmp_path / "app" / ".akadze").resolve()


def test_an_existing_akadze_directory_is_found_before_an_outer_marker(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "sub" / ".akadze").mkdir()
    home = embedded_home(root / "sub" / "deeper", user_env(tmp_path))
    assert home.directory == (root / "sub" / ".akadze").resolve()


def test_akadze_home_wins_and_the_old_name_still_works(tmp_path: Path) -> None:
    root = project(tmp_path)
    chosen = tmp_path / "chosen"
    home = embedded_home(root / "sub", user_env(
        tmp_path, AKADZE_HOME=str(chosen), AKADZE_EMBEDDED_DIR=str(tmp_path / "old")))
    assert home.pgdata == chosen.resolve() / "pgdata"
    assert "$AKADZE_HOME" in home.reason
    legacy = embedded_home(root / "sub", user_env(tmp_path, AKADZE_EMBEDDED_DIR="old"))
    assert legacy.directory == (root / "sub" / "old").resolve()  # relative: from where it runs
    assert "deprecated" in legacy.reason


def test_without_a_project_the_per_user_data_directory(tmp_path: Path) -> None:
    no_root_above(tmp_path)
    (tmp_path / "loose").mkdir()
    home = embedded_home(tmp_path / "loose", user_env(tmp_path))
    assert home.directory == (tmp_path / "data" / "akadze").resolve()
    assert "per-user" in home.reason
    env = user_env(tmp_path, XDG_DATA_HOME="relative/is/ignored")
    home = embedded_home(tmp_path / "loose", env)
    assert home.directory == (tmp_path / "home" / ".local" / "share" / "akadze").resolve()


# --- commands that only read create nothing ---------------------------------------------------

@pytest.mark.parametrize("command", [["jobs", "list"], ["stats"], ["jobs", "show", "1"],
                                     ["jobs", "cancel", "1"], ["schedules", APP]])
def test_read_only_commands_create_no_database(tmp_path: Path, command: list[str]) -> None:
    root = project(tmp_path)
    result = akadze(*command, cwd=root / "sub", env=user_env(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("akadze: error: no database: set AKADZE_DATABASE_URL"), lines
    assert str(root.resolve() / ".akadze" / "pgdata") in lines[0]
    assert created(tmp_path) == []


def test_read_only_commands_name_akadze_home_and_the_user_directory(tmp_path: Path) -> None:
    chosen = tmp_path / "chosen"
    result = akadze("stats", cwd=project(tmp_path), env=user_env(tmp_path,
                                                                 AKADZE_HOME=str(chosen)))
    assert result.returncode == 1
    assert f"{chosen.resolve() / 'pgdata'} (set by $AKADZE_HOME)" in result.stderr
    no_root_above(tmp_path)
    (tmp_path / "loose").mkdir()
    result = akadze("jobs", "list", cwd=tmp_path / "loose", env=user_env(tmp_path))
    assert result.returncode == 1
    assert str((tmp_path / "data" / "akadze" / "pgdata").resolve()) in result.stderr
    assert created(tmp_path) == []


@pytest.mark.parametrize("command", [["inspect", "active"], ["inspect", "stats"], ["status"],
                                     ["purge", "-f"], ["result", "1", "--timeout", "1"]])
def test_compat_read_only_commands_create_no_database(tmp_path: Path,
                                                      command: list[str]) -> None:
    root = project(tmp_path)
    result = run(["-m", "akadze_compat", *command], root / "sub", user_env(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("akadze-compat: error: no database:"), lines
    assert "`akadze-compat migrate`" in lines[0]
    assert created(tmp_path) == []


# --- one database per project -----------------------------------------------------------------

ENQUEUE = ("from tests.integration.cli_app import chatty\n"
           "print(chatty.enqueue())\n")


@pytest.mark.slow
def test_processes_started_in_different_directories_share_one_database(
        tmp_path: Path) -> None:
    root = project(tmp_path)
    env = user_env(tmp_path)
    pgdata = root.resolve() / ".akadze" / "pgdata"

    # A producer deep in the project creates the database at the root.
    produced = run(["-c", ENQUEUE], root / "sub" / "deeper", env)
    assert produced.returncode == 0, produced.stderr
    job_id = int(produced.stdout)
    assert created(tmp_path) == [root / ".akadze", root / ".akadze" / "pgdata"]

    # A worker started elsewhere in the project runs that job. cli.chatty reads the URL in
    # the --processes child, which joins the server too: the location is still said once.
    err = tmp_path / "worker.err"
    with open(err, "wb") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "akadze_core.cli", "worker", APP, "--processes", "1",
             *FAST], cwd=root / "sub", env={**env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        def finished() -> bool:
            assert worker.poll() is None, err.read_text()
            return re.search(rf"job {job_id} cli\.chatty succeeded", err.read_text()) is not None
        wait_for(finished, timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, err.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    log = err.read_text()
    assert re.search(r"tests\.cli_app: connected to postgresql://", log), log  # in the child
    location = [line for line in log.splitlines() if LOCATION in line]
    assert len(location) == 1, log
    assert f"{LOCATION}{pgdata} (" in location[0]
    assert "the project root, found by its .akadze/" in location[0]  # made by the producer

    # A command that only reads uses the database that now exists, from the root.
    listed = akadze("jobs", "list", "--json", cwd=root, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(job["id"], job["state"]) for job in json.loads(listed.stdout)] == [
        (job_id, "succeeded")]
    assert len([line for line in listed.stderr.splitlines() if LOCATION in line]) == 1
    assert created(tmp_path) == [root / ".akadze", root / ".akadze" / "pgdata"]
    assert not (pgdata / "postmaster.pid").exists()  # stopped with the last process
