"""The app of the ``akadze worker --processes`` tests: ``tests.workers.process_app:app``.

Bodies report the pid they ran in, so tests can tell the worker from its children.
"""

from __future__ import annotations

import os
import signal
import time

from akadze_core import App, current

if os.environ.get("PROCESS_APP_FAILS_IN_CHILD") and os.environ.get("AKADZE_PROCESS_CHILD"):
    # A child that cannot load the app (a missing setting of its own, a broken import).
    raise RuntimeError("process_app: cannot load in a child")

app = App(os.environ.get("AKADZE_DATABASE_URL"))


@app.task("whoami")
def whoami(pause: float = 0.0) -> list[float]:
    """The pid of the process running the body, and when the body started and ended
    (CLOCK_MONOTONIC is one clock for every process of the machine)."""
    started = time.monotonic()
    time.sleep(pause)
    return [os.getpid(), started, time.monotonic()]


@app.task("die_once")
def die_once() -> int:
    """The first run kills its own process (as the OOM killer would); later runs succeed."""
    if current().run_count == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


@app.task("hang", timeout=0.5)
def hang() -> None:
    """Never returns in time: only ending its process stops it."""
    time.sleep(3600)


@app.task("hang_2s", timeout=2.0)
def hang_2s() -> None:
    """``hang`` with time to look at the worker while it runs."""
    time.sleep(3600)


@app.task("in_tx")
def in_tx() -> None:
    """Completes itself inside a transaction of its own (complete_tx in a child)."""
    with current().complete_tx() as connection:
        connection.execute("SELECT 1")


@app.task("maybe_die")
def maybe_die(die: bool = False) -> int:
    """Returns at once, or kills its own process (a crash right after a quick start)."""
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


@app.task("hold")
def hold(path: str) -> None:
    """Keeps its process busy until the file ``path`` exists (or 30 s pass)."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task("touch")
def touch(path: str) -> None:
    """Creates the file ``path``: the mark that the body ran."""
    with open(path, "a", encoding="utf-8"):
        pass


@app.task("its_job")
def its_job() -> dict[str, object]:
    """The job as its body sees it (``current().job``), times in ISO 8601, and the types
    of its times."""
    job = current().job
    times = (job.scheduled_at, job.created_at, job.started_at, job.expires_at)
    return {**job.to_json(), "time_types": [type(value).__name__ for value in times]}


@app.task("looks_itself_up")
async def looks_itself_up() -> str:
    """An async body that uses the App's async API (its async pool): returns its state."""
    job = await app.get_job_async(current().id)
    assert job is not None
    return job.state


@app.task("stuck")
def stuck(path: str) -> None:
    """Writes its pid to ``path``, then blocks for a minute: only a signal ends it early."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(os.getpid()))
    time.sleep(60)


@app.task("shrugs_off_sigterm")
def shrugs_off_sigterm(path: str, then: str = "return") -> str:
    """Survives SIGTERM: its handler makes the blocked sleep end, then the body returns a
    value (``then="return"``) or raises (``then="raise"``)."""
    def handler(signum: int, frame: object) -> None:
        raise InterruptedError("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(str(os.getpid()))
        try:
            time.sleep(60)
        except InterruptedError:
            if then == "raise":
                raise RuntimeError("stopped by SIGTERM") from None
            return "finished anyway"
        return "slept"
    finally:
        signal.signal(signal.SIGTERM, previous)
