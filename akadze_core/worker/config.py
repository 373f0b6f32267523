"""``WorkerConfig``: the worker's settings as one value that owns their defaults and checks.

``Worker`` takes one (``Worker(app, config=...)``) or builds one from its keywords, and the
``akadze worker`` command prints its help's defaults from it, so no default is written twice.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..execution.processes import ProcessPool

Seconds = timedelta | float | int
Hook = Callable[[dict[str, Any]], Awaitable[None] | None]


def seconds(value: Seconds) -> float:
    """``value`` in seconds (a timedelta or a number)."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


#: Seconds a worker's statement waits for a lock by default: an ordinary short lock (an
#: ALTER TABLE that rewrites nothing, autovacuum's truncation) passes unnoticed, while one
#: held longer (LOCK TABLE, a long migration) sends the statement out of the lock queue,
#: where it would also hold up every session queued behind it, to be retried.
DEFAULT_LOCK_TIMEOUT = 2.0
#: The smallest connection budget: the LISTEN connection and two pooled ones.
MIN_CONNECTIONS = 3


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a ``Worker`` can be told, with its defaults; invalid values raise
    ``ValueError`` when the config is made. Durations are seconds or timedeltas (stored as
    float seconds). See ``Worker`` for what each setting does."""

    queues: Iterable[str] = ("default",)
    #: Concurrent runs per queue: an int for every queue, or ``{queue: n}`` (1 if absent).
    slots: int | Mapping[str, int] = 1
    heartbeat_interval: Seconds = 5.0
    heartbeat_ttl: Seconds = 30.0
    poll_interval: Seconds = 1.0
    shutdown_timeout: Seconds = 10.0
    fair: bool = False
    #: The name in ``akadze.workers``; None: ``host:pid``.
    name: str | None = None
    prune_interval: Seconds = 60.0
    prune_batch: int = 1000
    on_startup: Iterable[Hook] = ()
    on_shutdown: Iterable[Hook] = ()
    health_file: str | os.PathLike[str] | None = None
    #: None: 4 per slot, at least 100.
    max_pending_outcomes: int | None = None
    schedules: bool = True
    max_running: int | None = None
    process_pool: ProcessPool | None = None
    outcome_log_level: int = logging.INFO
    concurrency: int | None = None
    #: Seconds a statement of the worker waits for a lock before it gives up and is retried
    #: (an operator's ``LOCK TABLE``, a migration). None: ``lock_timeout_seconds()``.
    lock_timeout: Seconds | None = None
    #: The most connections this worker opens at once (its pool and its LISTEN connection);
    #: None: ``min(total slots, 16) + 7``. At least 3 (see ``MIN_CONNECTIONS``).
    max_connections: int | None = None
    #: Serve this worker's Prometheus metrics on this TCP port (``/metrics``; 0: any free
    #: port, logged); None: no metrics are counted or served.
    metrics_port: int | None = None
    #: The address the metrics port binds (127.0.0.1: this host only).
    metrics_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        # Normalised here so every reader sees one type; frozen, hence object.__setattr__.
        queues = tuple(dict.fromkeys(self.queues))
        object.__setattr__(self, "queues", queues)
        for field in ("heartbeat_interval", "heartbeat_ttl", "poll_interval",
                      "shutdown_timeout", "prune_interval"):
            object.__setattr__(self, field, seconds(getattr(self, field)))
        object.__setattr__(self, "on_startup", tuple(self.on_startup))
        object.__setattr__(self, "on_shutdown", tuple(self.on_shutdown))
        # The checks (and their words) the Worker made before this class existed, in order.
        if not queues:
            raise ValueError("a worker needs at least one queue")
        if min(self.slots_per_queue().values()) < 1:
            raise ValueError("slots must be at least 1 per queue")
        if seconds(self.heartbeat_ttl) <= seconds(self.heartbeat_interval):
            raise ValueError("heartbeat_ttl must be longer than heartbeat_interval")
        if self.max_running is not None and self.max_running < 1:
            raise ValueError("max_running must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lock_timeout is not None:
            object.__setattr__(self, "lock_timeout", seconds(self.lock_timeout))
            if not 0 < seconds(self.lock_timeout) < self._lock_timeout_limit():
                raise ValueError("lock_timeout must be more than 0 and less than "
                                 "heartbeat_ttl - heartbeat_interval")
        if self.max_connections is not None and self.max_connections < MIN_CONNECTIONS:
            raise ValueError(f"max_connections must be at least {MIN_CONNECTIONS} (the LISTEN "
                             "connection, and two pooled ones so that a heartbeat never "
                             "waits behind a claim or an outcome write)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError("metrics_port must be a TCP port (0 to 65535)")

    def _lock_timeout_limit(self) -> float:
        # A heartbeat that waited a whole lock_timeout and failed, then succeeded one
        # interval later, must still land within the TTL: a locked table never makes the
        # worker look dead.
        return seconds(self.heartbeat_ttl) - seconds(self.heartbeat_interval)

    def lock_timeout_seconds(self) -> float:
        """``lock_timeout`` in seconds; by default 2 s, or half of ``heartbeat_ttl -
        heartbeat_interval`` when that is shorter."""
        if self.lock_timeout is not None:
            return seconds(self.lock_timeout)
        return min(DEFAULT_LOCK_TIMEOUT, self._lock_timeout_limit() / 2)

    def pool_size(self) -> int:
        """The most connections of the worker's pool (``max_connections`` less the LISTEN
        connection; by default ``min(total slots, 16) + 6``)."""
        if self.max_connections is not None:
            return self.max_connections - 1
        # +6: the heartbeat and the maintenance services, the claim loop and the completer
        # may each hold one at once (a prune stuck on a lock must not starve the claims).
        return min(sum(self.slots_per_queue().values()), 16) + 6

    def health_file_path(self) -> Path | None:
        """``health_file`` as a ``Path``, or None."""
        return Path(self.health_file) if self.health_file else None

    def worker_name(self) -> str:
        """``name``, or ``host:pid`` by default."""
        return self.name or f"{socket.gethostname()}:{os.getpid()}"

    def pending_outcomes_limit(self) -> int:
        """``max_pending_outcomes``; by default 4 per slot, at least 100. Kept near the slot
        count, so few finished bodies sit 'running' (a crash would re-run them)."""
        if self.max_pending_outcomes:
            return self.max_pending_outcomes
        return max(100, 4 * sum(self.slots_per_queue().values()))

    def slots_per_queue(self) -> dict[str, int]:
        """``slots`` as a number for each of ``queues``."""
        if isinstance(self.slots, Mapping):
            return {queue: int(self.slots.get(queue, 1)) for queue in self.queues}
        return dict.fromkeys(self.queues, int(self.slots))

    def replace(self, **changes: Any) -> WorkerConfig:
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **changes)


#: The defaults, for help texts and for ``Worker``'s keywords.
DEFAULTS = WorkerConfig()
