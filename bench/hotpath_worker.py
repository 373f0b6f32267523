"""``python -m bench.hotpath_worker OUT.json AKADZE-ARGS...``: ``akadze AKADZE-ARGS`` with every
claim statement timed.

The worker is the one the real console script starts: this calls ``akadze_core.cli.main``
with the same arguments, in this process, after wrapping ``akadze_core.database.claim_jobs``
(the worker looks it up on the module at each claim) with a timer. The durations go into
one bucket per wall-clock second, each a bounded reservoir plus an exact count and maximum,
and are written to ``OUT.json`` every few seconds and at exit (the CLI leaves through
``exit_now``, which runs the atexit handlers). A duration is the wall time of the awaited
call: the statement's round trip plus any wait of the event loop before it resumes the
claim, which is the delay the worker itself sees.
"""

from __future__ import annotations

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

from akadze_core import database

#: Durations kept per second: far above the claim rate of a 64-slot worker at 800 jobs/s,
#: and a bound on memory whatever the rate.
RESERVOIR = 2000
DUMP_EVERY = 5.0


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

    def dump(self, path: Path) -> None:
        """Write every bucket to ``path`` (atomically: a reader never sees half a file)."""
        with self._lock:
            data = {str(second): {**bucket, "sample": list(bucket["sample"])}
                    for second, bucket in self._seconds.items()}
        temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"seconds": data}))
        temporary.replace(path)

    def dump_every(self, path: Path, interval: float) -> None:
        """Dump every ``interval`` seconds, forever (a daemon thread's loop)."""
        while True:
            time.sleep(interval)
            self.dump(path)


def timed(original: Callable[..., Awaitable[Any]],
          times: ClaimTimes) -> Callable[..., Awaitable[Any]]:
    """``original`` (an async function) recording each call's duration in ``times``."""

    async def claim_jobs(*args: Any, **kwargs: Any) -> Any:
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
    times = ClaimTimes()
    setattr(database, "claim_jobs", timed(database.claim_jobs, times))  # noqa: B010
    times.dump(out)  # an empty file at once: the bench knows the runner started
    atexit.register(times.dump, out)
    threading.Thread(target=times.dump_every, args=(out, DUMP_EVERY), daemon=True,
                     name="claim-times").start()
    from akadze_core import cli

    cli.main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
