"""``python -m bench.hotpath_producer URL RATE SECONDS``: offer RATE no-op jobs a second.

Paced on real elapsed time (the pgjqb contract's loop): every few milliseconds the jobs due
by now and not yet sent go out in one ``enqueue_many`` of at most ``MAX_BATCH``, so a
producer that falls behind catches up in small batches instead of one burst. What was
offered is read afterwards from the jobs' ``created_at`` (database clock); this prints only
its own total at the end.
"""

from __future__ import annotations

import signal
import sys
import time

from .apps.core_app import NOOP, make_app

MAX_BATCH = 50
TICK = 0.01


def produce(url: str, rate: float, seconds: float) -> int:
    """Offer ``rate`` jobs/s for ``seconds``; returns how many were enqueued."""
    app = make_app(url)
    task = app.tasks[NOOP]
    sent = 0
    started = time.monotonic()
    try:
        while (now := time.monotonic()) < started + seconds:
            due = int((now - started) * rate) - sent
            if due <= 0:
                time.sleep(TICK)
                continue
            batch = min(due, MAX_BATCH)
            task.enqueue_many([{"n": sent + i} for i in range(batch)])
            sent += batch
    finally:
        app.close()
    return sent


def main(argv: list[str]) -> int:
    """Run the producer; SIGTERM ends it early, still printing the total."""
    url, rate, seconds = argv[0], float(argv[1]), float(argv[2])
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    sent = produce(url, rate, seconds)
    print(f"producer: {sent} jobs offered in {seconds:g}s ({sent / seconds:.1f}/s)",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
