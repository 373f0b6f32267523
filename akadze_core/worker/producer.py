"""The producer: claims jobs into the worker's free slots, and knows when to claim again.

It owns the queues a worker claims from and their slots, the cap on runs, the fair
rotation's cursor, the floors where each queue's next claim starts reading, and the
backpressure on outcomes waiting to be written. Wake-ups (a NOTIFY, a slot freed, an
outcome batch written) set the shared ``wake`` event; between them it sleeps up to a poll
interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import psycopg

from ..store import database, limits, pauses
from ..store.floors import Floors
from .followups import FollowUps

if TYPE_CHECKING:
    from ..execution.processes import ProcessPool
    from .completer import Completer
    from .lease import Lease
    from .runs import Runs
    from .signals import Signals

logger = logging.getLogger("akadze.worker")

#: Seconds of claims one guarded step makes back to back (``Producer._claims``) before it
#: gives way to a new one.
CLAIMS_PER_STEP = 0.2


class Producer:
    """Claims ``queues`` (``slots`` runs each) into ``runs``; ``open`` hands it the
    completer whose pending outcomes hold claims back."""

    def __init__(self, signals: Signals, lease: Lease, runs: Runs, *, queues: Iterable[str],
                 slots: Mapping[str, int], fair: bool, max_running: int | None,
                 max_pending_outcomes: int, poll_interval: float, heartbeat_interval: float,
                 process_pool: ProcessPool | None) -> None:
        self._signals = signals
        self._lease = lease
        self._runs = runs
        #: The queues claimed from, in order (a new list on every change, so a claim round
        #: iterating the old one is not disturbed).
        self.queues = list(queues)
        #: Runs at once per queue.
        self.slots = dict(slots)
        #: A cap on runs across all queues; when it binds, queues are served in order.
        self.max_running = max_running
        #: The queues the listener wakes the worker for (changed in place).
        self.watched = set(self.queues)
        self.fair = fair
        # Backpressure: stop claiming while this many outcomes wait to be written.
        self.max_pending_outcomes = max_pending_outcomes
        self._poll_interval = poll_interval
        self._heartbeat_interval = heartbeat_interval
        self._process_pool = process_pool
        # fair=True: the task of each queue's last fair claim, where the rotation goes on.
        self._fair_cursor: dict[str, str | None] = dict.fromkeys(self.queues)
        #: Where each queue's next claim starts reading (see ``floors``).
        self.floors = Floors()
        #: Hears the insert notices: lowers the floors, and claims again shortly after.
        self.followups = FollowUps(self.floors, signals.wake)
        # Claims stopped because max_pending_outcomes outcomes wait to be written: the next
        # written batch wakes the claim loop.
        self._held_back = False
        self._completer: Completer | None = None
        #: The queues paused for the fleet, as last heard (akadze_core.store.pauses): not
        #: asked for jobs, which they would not give. Only a hint: the claim itself refuses
        #: a paused queue's jobs, so a stale entry costs one empty claim, never a job. Empty
        #: and not trusted while LISTEN is down (a resume could go unheard): every queue is
        #: then asked, and the set is read again once LISTEN is back.
        self.paused: set[str] = set()
        self._paused_stale = False
        # Pauses heard and LISTEN restarts so far: a read of the set that overlapped one is
        # not applied (read again while LISTEN is up).
        self._pauses_heard = 0
        # The queues whose claims go through the limited claim (akadze.claim_is_limited), as
        # read at most once a poll interval, and only after a claim came back short: a
        # short claim of one of them asks when a limit has room again, and wakes then.
        self._limited: set[str] = set()
        self._limited_read = -float("inf")
        self._limit_wake: asyncio.TimerHandle | None = None

    def open(self, completer: Completer) -> None:
        """Claims may start: ``completer`` holds the outcomes waiting to be written."""
        self._completer = completer

    def registration(self) -> tuple[list[str], list[int]]:
        """The queues and their slots, as the workers table lists them."""
        return self.queues, [self.slots[queue] for queue in self.queues]

    def add_queue(self, queue: str, slots: int | None) -> bool:
        """Claim from ``queue`` too; False when it already did."""
        if queue in self.queues:
            return False
        self.slots[queue] = slots if slots is not None else max(self.slots.values(), default=1)
        self._runs.busy.setdefault(queue, 0)
        self._fair_cursor.setdefault(queue, None)
        self.queues = [*self.queues, queue]
        self.watched.add(queue)
        return True

    def remove_queue(self, queue: str) -> bool:
        """Stop claiming from ``queue``; False when it did not claim from it."""
        if queue not in self.queues:
            return False
        self.queues = [name for name in self.queues if name != queue]
        self.watched.discard(queue)
        return True

    def listening(self, up: bool) -> None:
        """LISTEN started (``up``) or its connection was lost."""
        self.floors.set_listening(up)
        self.paused.clear()
        self._paused_stale = up
        # A read of the set under way when LISTEN went down (or restarted) is not applied.
        self._pauses_heard += 1

    def heard_pause(self, queue: str, paused: bool) -> None:
        """A NOTIFY said ``queue`` was paused or resumed for the fleet."""
        self._pauses_heard += 1
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)

    async def _read_paused(self, connection: psycopg.AsyncConnection) -> None:
        while self._paused_stale:
            heard = self._pauses_heard
            names = await pauses.paused_names(connection)
            if heard == self._pauses_heard:
                self.paused = names
                self._paused_stale = False

    # --- claims -----------------------------------------------------------------------------

    async def claim(self) -> None:
        """Fill the free slots of every queue, in order (under the claim lock)."""
        async with self._lease.claim_lock:
            await self._claim_queues()

    async def _claim_queues(self) -> None:
        if self._paused_stale and not await self._lease.guard(self._read_paused, "claim"):
            return
        for queue in self.queues:
            if queue in self.paused:
                continue
            self._runs.limit(queue, self.slots[queue])
            if not await self._claim_queue(queue):
                return

    async def _claim_queue(self, queue: str) -> bool:
        """Claim ``queue`` into its free slots until it is full or drained; False when a
        claim failed (no more claims this round)."""
        # The rows of a full claim made ahead of the slots (Runs.ahead), not started yet:
        # they start once the next claim is sent, so that claim goes out before their runs
        # are made and their bodies take the loop, and is answered while they run. Started
        # at the latest when this round ends, however it ends.
        ahead: list[dict[str, Any]] = []
        # Runs start in the claim loop's context variables (not the guarded step's, which
        # holds the statements' lock bound), however and wherever their claim was answered.
        claimer = contextvars.copy_context()

        def start(rows: list[dict[str, Any]]) -> None:
            claimer.run(self._start, rows)

        def begin() -> None:
            rows = ahead[:]
            ahead.clear()
            start(rows)

        # Why a step returned (``_claims``): empty when it made claims for as long as one
        # step may, and a new one goes on.
        ended: list[str] = []

        async def claims(connection: psycopg.AsyncConnection) -> None:
            await self._claims(connection, queue, ahead, begin, start, ended)

        try:
            while not ended:
                if not await self._lease.guard(claims, "claim", keep=True):
                    return False
            if ended[0] == "short":
                await self._after_short_claim(queue)
            return True
        finally:
            begin()

    async def _claims(self, connection: psycopg.AsyncConnection, queue: str,
                      ahead: list[dict[str, Any]], begin: Callable[[], None],
                      start: Callable[[list[dict[str, Any]]], None],
                      ended: list[str]) -> None:
        """Claim ``queue`` on ``connection`` back to back (one guarded step): each claim's
        answer is handled and the next one sent in the turn it is read, not two turns
        later through the guard's caller, behind every callback ready meanwhile. At most
        ``CLAIMS_PER_STEP`` seconds of claims: the step's bounds (the lease, the answer cap)
        count from its start. ``ended`` gets why it stopped: "full", "held", "short" or
        "stop"; nothing when the step just reached its length."""
        stop = self._signals.stop
        health = self._lease.health
        completer = self._completer
        assert completer is not None
        runs = self._runs
        loop = asyncio.get_running_loop()
        worker_id = self._lease.worker_id
        assert worker_id is not None
        until = time.monotonic() + CLAIMS_PER_STEP
        while not stop.is_set() and health.is_set():
            # The rows not started yet take their slots too.
            free = self.free(queue) - len(ahead)
            if free <= 0:
                ended.append("full")
                return
            if self._process_pool is None:
                # Claims of the slots at most: what is claimed ahead of them (Runs.ahead)
                # is the next claim, made while the runs of this one go on.
                free = min(free, self.slots[queue])
            if completer.pending >= self.max_pending_outcomes:
                # Backpressure. The slots may all be free already (short runs finish
                # before their outcomes are written), so no slot release will wake the
                # loop: the completer's next written batch does (written()).
                self._held_back = True
                ended.append("held")
                return
            if ahead:
                # psycopg sends the claim within the call, before it first waits for the
                # answer: the rows of the last claim start right after.
                loop.call_soon(begin)
            rows = await database.claim_jobs(
                connection, queue, free, worker_id, self.fair,
                after_task=self._fair_cursor[queue], floors=self.floors)
            if rows:
                self._fair_cursor[queue] = rows[-1]["task"]
            if len(rows) == free and runs.ahead(self.slots[queue]):
                ahead.extend(rows)  # until the next claim is on its way (above)
            else:
                begin()  # the rows of the last claim first, if any are left
                start(rows)
            if len(rows) < free:
                # Drained, or cut short by a limit; a full claim means claim again at once.
                ended.append("short")
                return
            if time.monotonic() >= until:
                return
        ended.append("stop")

    def _start(self, rows: list[dict[str, Any]]) -> None:
        """Start the runs of claimed ``rows``, in their order."""
        self._runs.start_many(rows)

    async def _after_short_claim(self, queue: str) -> None:
        guard = self._lease.guard
        now = time.monotonic()
        if now - self._limited_read >= self._poll_interval:
            self._limited_read = now

            async def read(connection: psycopg.AsyncConnection) -> None:
                self._limited = await limits.limited_queues(connection, self.queues)

            await guard(read, "limits")
        if queue not in self._limited:
            return
        waits: list[float | None] = []

        async def wait(connection: psycopg.AsyncConnection) -> None:
            waits.append(await limits.room_wait(connection, queue))

        if await guard(wait, "limits") and waits[0] is not None:
            # Claim again when the first start in a binding window leaves it. A key's slot
            # freed by another worker's run is found at the next poll.
            if self._limit_wake is not None:
                self._limit_wake.cancel()
            self._limit_wake = asyncio.get_running_loop().call_later(
                waits[0] + 0.001, self._signals.wake.set)

    def free(self, queue: str) -> int:
        """How many runs of ``queue`` a claim may take now."""
        # Short runs may take jobs ahead of the slots: a process pool's (ProcessPool.ahead),
        # or the runs' own (Runs.ahead) without a pool. Not under a cap on runs across
        # queues, which the queues' own gates would not hold.
        slots = self.slots[queue]
        if self._process_pool is not None:
            ahead = self._process_pool.ahead
        elif self.max_running is None:
            ahead = self._runs.ahead(slots)
        else:
            ahead = 0
        free = slots + ahead - self._runs.busy[queue]
        if self.max_running is not None:
            free = min(free, self.max_running + ahead - len(self._runs.running))
        return free

    async def sleep(self) -> None:
        """Until woken, or a poll interval (jittered) while slots are free, else an
        interval between heartbeats."""
        free = any(self.free(queue) > 0 for queue in self.queues)
        timeout = random.uniform(self._poll_interval / 2, self._poll_interval) if free \
            else self._heartbeat_interval
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._signals.wake.wait(), timeout)

    def written(self, rows: list[dict[str, Any]]) -> None:
        """An outcome batch was written (``rows``, as the database returned them)."""
        if self._held_back:
            # Claims stopped at max_pending_outcomes: claim again now. Without this the loop
            # slept a whole poll_interval with every slot free and jobs queued. The
            # completer drops the batch from its pending list right after this call, before
            # it next yields, so the woken loop sees the smaller count.
            self._held_back = False
            self._signals.wake.set()
        # Retries, snoozes and runs dropped unstarted are queued again below where this
        # worker's next claims would start reading: they lower its floors.
        # A list, not a generator: no frame resumed per row of every batch.
        self.floors.requeued([row for row in rows if row["state"] == "queued"])
        if rows and self._limited:
            # A run under a concurrency key just gave its slot back (committed already):
            # claim now, not at the next poll, or a key's jobs would start once a poll.
            self._signals.wake.set()
        if rows and rows[0].get("settled"):
            # The write released workflow jobs (committed already): claim now rather than
            # when the NOTIFY comes back.
            self._signals.wake.set()


__all__ = ["Producer"]
