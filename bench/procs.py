"""Subprocesses the benchmark starts, and what /proc says about them.

Every process is started in its own session (so its whole tree can be signalled by its
group id) and remembered; ``stop_all`` (registered with atexit, and run on SIGTERM) stops
the ones still alive. Only processes started here are ever signalled.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_started: list[subprocess.Popen[bytes]] = []
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def start(argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = subprocess.Popen(
            list(argv), stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
    _started.append(process)
    return process


def stop(process: subprocess.Popen[bytes], timeout: float = 20.0) -> int | None:
    """SIGTERM (a graceful stop), then SIGKILL to the process group after ``timeout``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    # The group: prefork children or anything left behind by a process that is gone.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)
    if process in _started:
        _started.remove(process)
    return process.returncode


def stop_all() -> None:
    """Stop every process started here that is still known."""
    for process in list(_started):
        stop(process, timeout=5)


def _on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # unwinds through finally blocks and atexit


def install_cleanup() -> None:
    """Stop our subprocesses on exit, Ctrl-C and SIGTERM."""
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, _on_sigterm)


def run(argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
        cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion, capturing stdout (stderr goes to ``log``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as errors:
        return subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=errors, text=True,
                              env=dict(env) if env is not None else None, cwd=cwd,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (None if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of ``pid`` so far (None if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces: fields are counted after its closing paren.
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids, frontier = [pid], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children(parent)]
        pids.extend(frontier)
    return pids


def load_average() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until true or ``timeout``; returns whether it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
