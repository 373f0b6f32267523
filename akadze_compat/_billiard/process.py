"""``billiard.process``: the current process, as Celery's pool children see it."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process

from ..worker.pool import child_info

__all__ = ["current_process"]


def current_process() -> multiprocessing.process.BaseProcess:
    """This process; in a prefork pool child, named ``ForkPoolWorker-<n>`` with ``index``
    ``n - 1``, as billiard names its pool's processes."""
    process = multiprocessing.current_process()
    info = child_info()
    if info is not None:
        process.name = f"ForkPoolWorker-{info.number}"
        # billiard's pool indexes its processes from 0; code uses it to pick per-child
        # resources (a port, a device).
        process.index = info.number - 1  # type: ignore[attr-defined]
    return process
