"""Running the real ``akadze-compat`` command against the sample projects in ``projects/``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PROJECTS = Path(__file__).resolve().parent / "projects"
DJANGO_PROJECT = PROJECTS / "djangoproj"
#: Short timings so the tests do not wait on polling (see akadze_compat.bin.worker).
FAST = {"AKADZE_POLL_INTERVAL": "0.1", "PYTHONUNBUFFERED": "1"}
#: Variables of the test environment that would change what the projects connect to.
_CLEARED = ("AKADZE_DATABASE_URL", "CELERY_BROKER_URL", "BROKER_URL", "APP",
            "DJANGO_SETTINGS_MODULE", "CONFIG_MODULE")


def command() -> list[str]:
    """The installed console script, else ``python -m akadze_compat``."""
    script = Path(sys.executable).with_name("akadze-compat")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "akadze_compat"]


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command: this one, without database settings, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key not in _CLEARED}
    return {**env, **FAST, **(extra or {})}


def run(*args: str, cwd: Path = PROJECTS, env: dict[str, str] | None = None,
        input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``akadze-compat *args`` to completion."""
    return subprocess.run([*command(), *args], cwd=cwd, env=environment(env), input=input,
                          capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    """A command's stderr without warnings and without the sample project's own prints."""
    return [line for line in stderr.splitlines()
            if line.strip() and not line.startswith(("akadze-compat: warning:",
                                                     "plainproj-signal "))]


class CompatWorker:
    """One ``akadze-compat ... worker`` subprocess; stdout and stderr go to a log file."""

    def __init__(self, log_path: Path, args: list[str], *, cwd: Path = PROJECTS,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*command(), *args], cwd=cwd, env=environment(env),
                                     stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def wait_log(self, text: str | re.Pattern[str], timeout: float = 30.0, count: int = 1) -> None:
        """Wait until ``text`` (a string or regex) appears ``count`` times in the log."""
        def found() -> int:
            log = self.log()
            return len(text.findall(log)) if isinstance(text, re.Pattern) else log.count(text)

        deadline = time.monotonic() + timeout
        while found() < count:
            if self.proc.poll() is not None and found() < count:
                raise AssertionError(f"worker exited ({self.proc.returncode}) before logging "
                                     f"{text!r}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the worker log after {timeout}s:\n"
                                     f"{self.log()}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for Celery's "<node> ready." line (needs -l INFO)."""
        self.wait_log(re.compile(r"\S+@\S+ ready\."), timeout)

    def terminate(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout}s:\n{self.log()}") \
                from None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop (prefork children follow their parent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def wait_until(predicate: Callable[[], object], timeout: float = 30.0,
               interval: float = 0.05) -> object:
    """Poll until ``predicate()`` is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(interval)
