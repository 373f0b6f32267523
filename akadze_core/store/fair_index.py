"""The fair-claim index, built by the workers that read it.

``job_claim_fair`` finds a queue's task names by a loose index scan of
``jobs_fair_claim_idx`` (queue, task, priority, scheduled_at, id). Every job inserted queued
paid for an entry there, about a fifth of a bulk insert, for workers that few run, so
migration 0015 drops it and a worker started with ``fair=True`` builds it before it
registers:

- ``CREATE INDEX CONCURRENTLY``: enqueues and claims go on during the build, which waits
  for the transactions open on ``akadze.jobs`` when it starts (one left idle in transaction
  holds it up: the log says it is building);
- one builder at a time, under a session-level advisory lock on a direct connection (the
  LISTEN URL: a transaction pooler would hand a session lock to whichever client comes
  next); the others wait for it, and take over when its session ends before it finished;
- an invalid index left by an interrupted build is dropped and built again;
- a role that may not create it (not the owner of ``akadze.jobs``) gets a warning and the
  worker starts anyway: its fair claims are right without the index, only slower on a long
  queue, until the owner builds it (``create_sql()``).

A worker stopped while building cancels the build (what is left is invalid, and the next
fair worker builds it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ..model.dsn import listen_url
from . import database
from .queries import all_queries, query

logger = logging.getLogger("akadze.worker")

#: The advisory lock its builder holds (any constant, the same in every worker).
BUILD_LOCK = 0x616B61647A66
def _one_line(text: str) -> str:
    return " ".join(" ".join(line for line in text.splitlines()
                             if not line.lstrip().startswith("--")).split())


def create_sql() -> str:
    """What an owner of ``akadze.jobs`` runs to build the index by hand, in the dialect of
    this process (one line, no comment)."""
    return _one_line(query("fair_index_create"))


#: ``create_sql()`` on one server.
CREATE_SQL = _one_line(all_queries()["fair_index_create"])
#: Seconds between looks while another session builds it.
POLL_SECONDS = 1.0


async def ensure(database_url: str, connect_kwargs: dict[str, Any], stop: asyncio.Event,
                 *, redact: Callable[[str], str] = str) -> None:
    """Return once ``jobs_fair_claim_idx`` is valid (built here or by another session), or
    ``stop`` is set, or this role may not build it (a warning). ``SchemaMissing`` and
    connection errors propagate (the worker's start handles them). ``redact`` scrubs a
    password from what is logged."""
    kwargs = {**connect_kwargs, "autocommit": True}
    async with await psycopg.AsyncConnection.connect(listen_url(database_url),
                                                     **kwargs) as connection:
        await database.check_schema_async(connection)
        told = False
        while not stop.is_set():
            state = await database.fair_index_state(connection)
            if state is not None and state.valid:
                return
            if (state is None or not state.building) \
                    and await database.fair_index_try_lock(connection, BUILD_LOCK):
                try:
                    if await _build(connection, stop, redact):
                        return
                finally:
                    await database.fair_index_unlock(connection, BUILD_LOCK)
                continue
            if not told:
                logger.info("waiting for another session building jobs_fair_claim_idx "
                            "(the fair-claim index)")
                told = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)


async def _build(connection: psycopg.AsyncConnection, stop: asyncio.Event,
                 redact: Callable[[str], str]) -> bool:
    """Under the build lock: build the index unless it is valid now or another session
    (one not taking the lock: an operator) builds it. True when nothing is left to wait
    for: built, valid, or not ours to build."""
    state = await database.fair_index_state(connection)  # again: the last holder may have
    if state is not None and (state.valid or state.building):  # finished just before
        return state.valid
    logger.info("building jobs_fair_claim_idx, the index fair claims read (once per "
                "database; CONCURRENTLY: enqueues and claims go on meanwhile)")
    started = time.monotonic()
    build = asyncio.ensure_future(database.fair_index_build(connection,
                                                            drop_first=state is not None))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({build, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not build.done():
        build.cancel()  # psycopg cancels the statement on the server
        with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
            await build
        logger.info("stopped while building jobs_fair_claim_idx; the next fair worker "
                    "builds it")
        return True
    try:
        build.result()
    except psycopg.errors.InsufficientPrivilege as exc:
        logger.warning("cannot build jobs_fair_claim_idx (%s): fair claims go on without it, "
                       "slower on a long queue; an owner of akadze.jobs can build it with: %s",
                       redact(" ".join(str(exc).split())), create_sql())
        return True
    except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):
        return False  # created meanwhile by a session not taking the lock: look again
    logger.info("built jobs_fair_claim_idx in %.1fs", time.monotonic() - started)
    return True
