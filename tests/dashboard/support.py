"""What the dashboard tests start: the dashboard and a worker as subprocesses (the real
console commands), an HTTP client with cookies, and headless Chromium."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("AKADZE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AKADZE_CHROMEDRIVER", "/usr/bin/chromedriver")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """A subprocess of ours whose output goes to a file; stopped with SIGTERM, then
    SIGKILL, by its pid."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                     os.environ.get("PYTHONPATH"), str(PROJECT_ROOT)))),
                 "PYTHONUNBUFFERED": "1", **env})

    def log(self) -> str:
        """Everything it wrote so far."""
        return self.log_path.read_text("utf-8", errors="replace")

    def wait_log(self, text: str, timeout: float = 20.0) -> None:
        """Wait until ``text`` appears in its output."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.proc.poll() is not None:
                raise AssertionError(f"exited ({self.proc.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; closes the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@dataclass
class Served:
    """A running ``akadze dashboard``: its base URL and process."""

    base: str
    process: Process


@contextlib.contextmanager
def dashboard(url: str, tmp_path: Path, *options: str, command: tuple[str, ...] | None = None,
              env: dict[str, str] | None = None, prefix: str = "") -> Iterator[Served]:
    """``akadze dashboard --port P OPTIONS`` on ``url`` (passed in the environment, as
    SECURITY.md advises), until the block ends. ``command`` replaces the CLI's words (e.g.
    the compat ``flower`` command)."""
    port = free_port()
    args = list(command or ("-m", "akadze_core.cli", "dashboard"))
    process = Process([*args, "--port", str(port), *options],
                      tmp_path / f"dashboard-{port}.log",
                      {"AKADZE_DATABASE_URL": url, **(env or {})})
    try:
        base = f"http://127.0.0.1:{port}{prefix}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError) as exc:
                if process.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"dashboard did not start ({exc}):\n"
                                         f"{process.log()}") from None
                time.sleep(0.1)
        yield Served(base, process)
    finally:
        process.stop()


@contextlib.contextmanager
def worker(url: str, tmp_path: Path, *options: str) -> Iterator[Process]:
    """``akadze worker tests.dashboard.dash_app:app OPTIONS`` until the block ends."""
    process = Process(["-m", "akadze_core.cli", "worker", "tests.dashboard.dash_app:app",
                       "--heartbeat-interval", "0.5", *options],
                      tmp_path / "worker.log", {"AKADZE_DATABASE_URL": url})
    try:
        process.wait_log(") started: queues")
        yield process
    finally:
        process.stop()


@dataclass
class Answer:
    """One HTTP answer (after redirects)."""

    status: int
    url: str
    headers: dict[str, str]
    text: str


class Client:
    """An HTTP client with a cookie jar (the CSRF and session cookies), as a browser keeps."""

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.headers = dict(headers or {})
        self.form_token = ""

    def request(self, method: str, url: str, form: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Answer:
        """``method url`` (a form is sent urlencoded); redirects followed, errors returned."""
        body = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(url, data=body, method=method,
                                         headers={**self.headers, **(headers or {})})
        try:
            with self.opener.open(request, timeout=30) as response:
                answer = Answer(response.status, response.url, dict(response.headers),
                                response.read().decode())
        except urllib.error.HTTPError as exc:
            answer = Answer(exc.code, url, dict(exc.headers), exc.read().decode())
        found = re.search(r'name="csrf" value="([^"]+)"', answer.text)
        if found:
            self.form_token = found.group(1)
        return answer

    def get(self, url: str, **kwargs: Any) -> Answer:
        """GET ``url``."""
        return self.request("GET", url, **kwargs)

    def post(self, url: str, form: dict[str, Any], **kwargs: Any) -> Answer:
        """POST ``form`` to ``url``."""
        return self.request("POST", url, form, **kwargs)

    def csrf(self) -> str:
        """The CSRF token the last page's forms carried (as a browser submits it)."""
        if not self.form_token:
            raise AssertionError("no form token yet: GET a page with a form first")
        return self.form_token

    def cookie(self, name: str) -> str | None:
        """The value of cookie ``name`` in the jar, if any."""
        for cookie in self.jar:
            if cookie.name == name:
                return str(cookie.value)
        return None


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$AKADZE_ARTIFACTS/dashboard`` or the test's tmp dir."""
    root = os.environ.get("AKADZE_ARTIFACTS")
    folder = Path(root) / "dashboard" if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def chromium(*arguments: str) -> Iterator[Any]:
    """Headless Debian Chromium through Debian's chromedriver (nothing downloaded), with
    more command-line ``arguments``; skips the test with one line where either is
    missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        pytest.skip(f"no browser: {', '.join(missing)} missing (apt-get install chromium "
                    "chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("no browser: selenium is not installed (pip install '.[test]')")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1366,1000", "--disable-extensions",
                     "--no-first-run", "--disable-background-networking", *arguments):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
