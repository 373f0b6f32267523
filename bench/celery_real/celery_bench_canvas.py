"""The chord program of the canvas workload, under real Celery (its virtualenv only).

``python -m celery_bench_canvas --members N --rounds R``: with a worker already running on
``$BENCH_QUEUE`` (broker and result backend ``$BENCH_BROKER_URL``, ``$BENCH_RESULT_BACKEND``),
one warm-up round trip, then R times ``chord(group(chord_member.s(i) for i in range(N)),
chord_body.s()).apply_async()``, waiting for the body's result (the time it started, on this
host's clock) each time, the header's results checked for a failure once it came. Prints
``{"runs": [body start - client clock before apply_async], "publish": [seconds apply_async
took]}`` as JSON. ``--purge`` empties the queue (and
``--delete`` removes it and this program's result keys).
"""

from __future__ import annotations

import argparse
import json
import time

from celery import chord, group
from celery_bench_app import app, chord_body, chord_member
from kombu import Exchange, Queue


def _purge(delete: bool) -> None:
    name = app.conf.task_default_queue
    with app.connection_for_write() as connection:
        bound = Queue(name).bind(connection.default_channel)
        bound.declare()
        bound.purge()
        if delete:
            bound.delete()
            Exchange(name).bind(connection.default_channel).delete()
            client = connection.default_channel.client
            client.delete(f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
            # The result backend shares this Redis database (one of the benchmark's own).
            for pattern in ("celery-task-meta-*", "celery-taskset-meta-*", "chord-unlock-*",
                            "_kombu.binding_deadlines"):
                keys = list(client.scan_iter(match=pattern, count=1000))
                for start in range(0, len(keys), 1000):
                    client.delete(*keys[start:start + 1000])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--purge", action="store_true")
    parser.add_argument("--delete", action="store_true")
    options = parser.parse_args()
    if options.purge:
        _purge(options.delete)
        print(json.dumps({"purged": True}))
        return
    chord_body.delay().get(timeout=120)  # the worker is up and the pools warm
    runs, publish = [], []
    for _ in range(options.rounds):
        signatures = [chord_member.s(i) for i in range(options.members)]
        result = None  # the last round's results freed before the clock starts (as akadze's)
        started = time.time()
        result = chord(group(signatures), chord_body.s()).apply_async()
        publish.append(time.time() - started)
        # Celery's get() with follow_parents (its default) re-reads every header member's
        # state after each message its Redis result consumer drains, and it drains one
        # message per member (each member's result is subscribed to): 10,000 x 10,000
        # checks in the client, which then held a core for minutes beside the worker. The
        # header is checked once after the body's result instead, as akadze's get() does.
        runs.append(result.get(timeout=1200, follow_parents=False) - started)
        result.parent.maybe_throw()
        result.forget()
    print(json.dumps({"runs": runs, "publish": publish}))


if __name__ == "__main__":
    main()
