"""Publish the no-op tasks a Celery drain will consume (or delete the queue).

Runs only in the Celery virtualenv: ``python -m celery_bench_publish --jobs N`` purges the
queue, publishes N tasks with ``apply_async`` from ``--processes`` processes (publishing is
one broker round trip per task: parallel senders only shorten the set-up, they change
nothing in the drain) and prints ``{"published": N, "seconds": S, "queued": Q}`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time

from celery_bench_app import app, noop
from kombu import Exchange, Queue


def _queue(connection):
    bound = Queue(app.conf.task_default_queue).bind(connection.default_channel)
    bound.declare()
    return bound


def _publish(start: int, stop: int) -> None:
    with app.producer_or_acquire() as producer:
        for n in range(start, stop):
            noop.apply_async((n,), producer=producer)


def main() -> None:
    """Purge, then publish ``--jobs`` tasks (``--delete``: remove the queue and stop)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--delete", action="store_true")
    options = parser.parse_args()
    with app.connection_for_write() as connection:
        bound = _queue(connection)
        bound.purge()
        if options.delete:
            bound.delete()
            # Celery declared a direct exchange of the queue's name: leave nothing behind.
            name = app.conf.task_default_queue
            Exchange(name).bind(connection.default_channel).delete()
            if connection.transport.driver_type == "redis":  # kombu keeps binding sets
                connection.default_channel.client.delete(
                    f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
            print(json.dumps({"deleted": True}))
            return
    started = time.perf_counter()
    share = -(-options.jobs // options.processes)
    ranges = [(start, min(options.jobs, start + share))
              for start in range(0, options.jobs, share)]
    context = multiprocessing.get_context("spawn")  # fresh broker connections per sender
    senders = [context.Process(target=_publish, args=bounds) for bounds in ranges]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    seconds = time.perf_counter() - started
    with app.connection_for_write() as connection:
        _, queued, _ = _queue(connection).queue_declare(passive=True)
    print(json.dumps({"published": options.jobs, "seconds": seconds, "queued": queued}))


if __name__ == "__main__":
    main()
