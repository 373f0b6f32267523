"""The cyclic garbage collector in a process that only runs jobs.

A worker process keeps every object its start-up made (modules, classes, the app, its tasks:
some 50,000 in a Celery project) for its whole life, and each collection of the oldest
generation walked them all again. Jobs in flight (their rows, contexts, requests, outcomes)
live from their claim to their written outcome, so the default young threshold of 700
allocations collected the same few hundred live runs over and over, while runs hardly ever
leave cycles behind. In a drain of no-op Celery tasks on 50 threads the collector took
~6 µs of CPU a job; with start-up frozen and a young threshold of 10,000, ~1 µs.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_heap"]

#: CPython's thresholds through 3.12: only these are changed (a project that set its own,
#: at import or in a start-up signal, keeps them).
_DEFAULT_THRESHOLD = (700, 10, 10)
#: Container allocations between two young collections in a process that runs jobs.
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Before a process that it owns starts running jobs (a worker command, a pool child):
    collect once, move what survives out of the collector's sight for good (``gc.freeze``:
    start-up objects are not garbage, and never walked again), and collect the young
    generation every ``YOUNG_THRESHOLD`` allocations instead of 700 when the thresholds are
    still the interpreter's defaults. Never called by the library for its caller's process:
    the collector's settings belong to whoever owns it."""
    gc.collect()
    gc.freeze()
    if gc.get_threshold() == _DEFAULT_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *_DEFAULT_THRESHOLD[1:])
