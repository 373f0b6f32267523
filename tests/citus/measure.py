"""The figures of docs/how-to/citus.md: ``python -m tests.citus.measure [jobs]``.

Starts a coordinator and two workers (as the tests do), migrates in Citus mode with four
lanes, and times on the same machine, for Citus mode and for one server (a database without
Citus on the coordinator's server: the same settings, fsync off): enqueue_many, one enqueue
per call, a worker draining the jobs (no-op bodies), and a chord (a fan-in of no-op members
and a body taking their results: the workflow in one shard, settled there).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from akadze_core import App, Worker
from akadze_core.store.migrations import migrate
from akadze_core.store.queries import use_dialect
from tests.citus.cluster import CitusCluster, citus_bin


def cpu_seconds(postmaster: int | None) -> float:
    """CPU time of a server: its postmaster with the children it reaped (cutime, cstime),
    plus the children alive now (backends, background workers)."""
    if postmaster is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the name: state, ppid, ... utime is field 14 of stat, i.e. index 11 here.
        if int(entry) == postmaster:
            total += sum(int(value) for value in fields[11:15])
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def count(url: str, state: str) -> int:
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT count(*) FROM akadze.jobs WHERE state = %s",
                                 (state,)).fetchone()
    return int(row[0]) if row else 0


async def measure(url: str, citus: bool, jobs: int,
                  servers: dict[str, int | None]) -> dict[str, Any]:
    app = App(url, citus=citus)

    @app.task("noop")
    async def noop(n: int) -> None: ...

    started = time.perf_counter()
    for first in range(0, jobs, 1000):
        noop.enqueue_many([{"n": n} for n in range(first, min(first + 1000, jobs))])
    bulk = jobs / (time.perf_counter() - started)
    singles = 500
    started = time.perf_counter()
    for n in range(singles):
        noop.enqueue(n=n)
    single = singles / (time.perf_counter() - started)
    worker = Worker(app, slots=20, poll_interval=0.1)
    before = {name: cpu_seconds(pid) for name, pid in servers.items()}
    runner = asyncio.create_task(worker.run())
    started = time.perf_counter()
    while count(url, "succeeded") < jobs + singles:
        await asyncio.sleep(0.1)
    drain = (jobs + singles) / (time.perf_counter() - started)
    # Server CPU per job drained (the count() polls add a little to the coordinator's).
    cpu = {name: (cpu_seconds(pid) - before[name]) / (jobs + singles) * 1e6
           for name, pid in servers.items()}
    worker.request_stop()
    await asyncio.wait_for(runner, 60)
    await app.close_async()
    return {"enqueue_many": bulk, "enqueue": single, "drain": drain, "cpu": cpu}


async def measure_chord(url: str, citus: bool, members: int,
                        servers: dict[str, int | None]) -> dict[str, Any]:
    app = App(url, citus=citus)

    @app.task("part")
    async def part(n: int) -> int:
        return n

    @app.task("total")
    async def total(values: list[int]) -> int:
        return sum(values)

    flow = app.workflow()
    parts = flow.add_many(part, [{"n": n} for n in range(members)])
    body = flow.add(total, after=parts, result_arg="values")
    started = time.perf_counter()
    flow.enqueue()
    enqueue = (members + 1) / (time.perf_counter() - started)
    worker = Worker(app, slots=20, poll_interval=0.1)
    before = {name: cpu_seconds(pid) for name, pid in servers.items()}
    runner = asyncio.create_task(worker.run())
    started = time.perf_counter()
    assert body.id is not None

    async def body_state() -> str | None:
        done = await app.get_job_async(body.id or 0)
        return done.state if done else None

    while await body_state() != "succeeded":
        await asyncio.sleep(0.1)
    drain = (members + 1) / (time.perf_counter() - started)
    cpu = {name: (cpu_seconds(pid) - before[name]) / (members + 1) * 1e6
           for name, pid in servers.items()}
    done = await app.get_job_async(body.id)
    assert done is not None and done.result == sum(range(members))
    worker.request_stop()
    await asyncio.wait_for(runner, 60)
    await app.close_async()
    return {"enqueue": enqueue, "drain": drain, "cpu": cpu}


def report_chord(name: str, members: int, figures: dict[str, Any]) -> None:
    print(f"{name:<24} chord of {members:,}: enqueue {figures['enqueue']:8,.0f} jobs/s   "
          f"drain to the body {figures['drain']:6,.0f} jobs/s")
    print(f"{'':<24} server CPU per job drained: " + ", ".join(
        f"{name} {micros:,.0f} us" for name, micros in figures["cpu"].items()))


def report(name: str, figures: dict[str, Any]) -> None:
    print(f"{name:<24} enqueue_many {figures['enqueue_many']:8,.0f} jobs/s   "
          f"enqueue {figures['enqueue']:6,.0f} jobs/s   drain {figures['drain']:6,.0f} jobs/s")
    print(f"{'':<24} server CPU per job drained: " + ", ".join(
        f"{name} {micros:,.0f} us" for name, micros in figures["cpu"].items()))


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    bin_dir, reason = citus_bin()
    if bin_dir is None:
        sys.exit(reason)
    with CitusCluster(bin_dir) as cluster:
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE akadze_single")
        single_url = cluster.coordinator.url("akadze_single")
        with psycopg.connect(single_url, autocommit=True) as connection:
            migrate(connection)
        coordinator = {"server": cluster.coordinator.pid()}
        report("one server", asyncio.run(measure(single_url, False, jobs, coordinator)))
        report_chord("one server", jobs // 5,
                     asyncio.run(measure_chord(single_url, False, jobs // 5, coordinator)))
        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            migrate(connection, citus=True, lanes=4)
        nodes = {"coordinator": cluster.coordinator.pid(),
                 **{f"worker{i + 1}": node.pid() for i, node in enumerate(cluster.workers)}}
        report("citus, 2 worker nodes", asyncio.run(measure(cluster.url(), True, jobs, nodes)))
        report_chord("citus, 2 worker nodes", jobs // 5,
                     asyncio.run(measure_chord(cluster.url(), True, jobs // 5, nodes)))
        use_dialect("postgres")


if __name__ == "__main__":
    main()
