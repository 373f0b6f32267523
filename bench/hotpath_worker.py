"""``python -m bench.hotpath_worker OUT.json AKADZE-ARGS...``: ``akadze AKADZE-ARGS`` with every
claim statement timed.

The worker is the one the real console script starts: this calls ``akadze_core.cli.main.main``
with the same arguments, in this process, after wrapping ``akadze_core.store.database.claim_jobs``
(the worker looks it up on the module at each claim) with a timer. The durations go into
one bucket per wall-clock second, each a bounded reservoir plus an exact count and maximum,
and are written to ``OUT.json`` every few seconds and at exit (the CLI leaves through
``exit_now``, which runs the atexit handlers). A duration is the wall time of the awaited
call: the statement's round trip plus any wait of the event loop before it resumes the
claim, which is the delay the worker itself sees. To tell the two apart, the first claim
also starts a probe in the worker's event loop that sleeps ``LAG_TICK`` again and again and
records by how much each sleep overran (``loop_lag`` in ``OUT.json``): a claim p99 near the
loop lag p99 is the loop (or the machine) being busy, not the statement.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from akadze_core.store import database

#: Durations kept per second: far above the claim rate of a 64-slot worker at 800 jobs/s,
#: and a bound on memory whatever the rate.
RESERVOIR = 2000
DUMP_EVERY = 5.0
LAG_TICK = 0.01


class ClaimTimes:
    """Claim durations (ms) by wall-clock second: a reservoir sample, a count, the max."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[int, dict[str, Any]] = {}
        self._random = random.Random(0)

    def add(self, at: float, ms: float) -> None:
        """One claim that started at epoch ``at`` and took ``ms``."""
        with self._lock:
            bucket = self._seconds.setdefault(int(at), {"count": 0, "max": 0.0, "sample": []})
            bucket["count"] += 1
            bucket["max"] = max(bucket["max"], ms)
            sample: list[float] = bucket["sample"]
            if len(sample) < RESERVOIR:
                sample.append(ms)
            else:
                slot = self._random.randrange(bucket["count"])
                if slot < RESERVOIR:
                    sample[slot] = ms

    def buckets(self) -> dict[str, dict[str, Any]]:
        """A copy of every bucket, keyed by the second as a string (for JSON)."""
        with self._lock:
            return {str(second): {**bucket, "sample": list(bucket["sample"])}
                    for second, bucket in self._seconds.items()}


def dump(path: Path, claims: ClaimTimes, lag: ClaimTimes) -> None:
    """Write both series to ``path`` (atomically: a reader never sees half a file)."""
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"seconds": claims.buckets(),
                                     "loop_lag": lag.buckets()}))
    temporary.replace(path)


def dump_every(path: Path, claims: ClaimTimes, lag: ClaimTimes, interval: float) -> None:
    """Dump every ``interval`` seconds, forever (a daemon thread's loop)."""
    while True:
        time.sleep(interval)
        dump(path, claims, lag)


async def probe_lag(lag: ClaimTimes) -> None:
    """Record how late each ``LAG_TICK`` sleep of this event loop wakes up, forever."""
    while True:
        at = time.time()
        started = time.perf_counter()
        await asyncio.sleep(LAG_TICK)
        lag.add(at, max(0.0, (time.perf_counter() - started - LAG_TICK) * 1000))


def timed(original: Callable[..., Awaitable[Any]], times: ClaimTimes,
          lag: ClaimTimes) -> Callable[..., Awaitable[Any]]:
    """``original`` (an async function) recording each call's duration in ``times``; the
    first call starts ``probe_lag`` in the loop it runs in."""
    probes: set[asyncio.Task[None]] = set()  # a reference, or the task may be collected

    async def claim_jobs(*args: Any, **kwargs: Any) -> Any:
        if not probes:
            probes.add(asyncio.get_running_loop().create_task(probe_lag(lag)))
        at = time.time()
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            times.add(at, (time.perf_counter() - started) * 1000)

    return claim_jobs


def main(argv: list[str]) -> None:
    """Time the claims, then run the CLI with the remaining arguments (does not return)."""
    if len(argv) < 2:
        sys.exit("usage: python -m bench.hotpath_worker OUT.json AKADZE-ARGS...")
    out = Path(argv[0])
    times, lag = ClaimTimes(), ClaimTimes()
    setattr(database, "claim_jobs", timed(database.claim_jobs, times, lag))  # noqa: B010
    dump(out, times, lag)  # an empty file at once
    atexit.register(dump, out, times, lag)
    threading.Thread(target=dump_every, args=(out, times, lag, DUMP_EVERY), daemon=True,
                     name="claim-times").start()
    from akadze_core.cli import main as cli

    cli.main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
