"""``python -m bench.profile``: where a core drain's worker spends its time (py-spy).

Runs one core drain (``akadze worker`` on async no-ops, as in the benchmark) with
``py-spy record --idle`` attached to the worker from its start, writes the collapsed stacks
(open them in https://www.speedscope.app) and prints a breakdown: each sample goes to the
first bucket below whose frames it contains, so the buckets add up to 100 % of the
worker's wall time; "busy" leaves the idle samples out. Needs ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from . import core, db, procs

# (label, frames any of which puts a sample in the bucket), most specific first.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("idle: epoll wait (Postgres answers, new work)", ("EpollSelector.select",)),
    ("start-up: imports, connect, register", ("importlib", "Worker._start ", "load_app")),
    ("completer: one log line per outcome", ("Worker._outcomes_written",)),
    ("completer: complete_many SQL", ("complete_many",)),
    ("claim: claim_jobs SQL", ("claim_jobs",)),
    ("claim: start runs (create_task)", ("Runs.start ",)),
    ("runs: _run_job / execute", ("Runs._run_job",)),
    ("maintenance: heartbeat, rescue, prune", ("Lease.heartbeat", "Rescue.step",
                                               "Prune.step", "Orphans._return_orphans")),
    ("listener (NOTIFY)", ("Worker._listen",)),
    ("other logging", ("logging/__init__.py",)),
    ("completer loop, other", ("Completer.",)),
    ("claim loop, other (_round, sleep, guard)", ("Worker._", "Producer.", "Lease.")),
    ("asyncio event loop", ("asyncio/",)),
]
IDLE = BUCKETS[0][0]
# Cross-cutting costs, counted wherever they occur (inclusive).
ACROSS: list[tuple[str, tuple[str, ...]]] = [
    ("logging (any)", ("logging/__init__.py",)),
    ("password scrubbing of log lines (cli_support Secrets.scrub)", ("Secrets.scrub",)),
    ("psycopg (any)", ("psycopg/",)),
    ("send() syscalls to Postgres (native only)", ("send (libc",)),
    ("asyncio create_task / Task init", ("create_task", "Task___init__")),
    ("Job.from_row / decode_job", ("decode_job",)),
]


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: ``frame;frame;... count`` per line."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            stacks.append((stack.split(";"), int(count)))
    return stacks


def bucket_of(frames: list[str]) -> str:
    """The first bucket any of whose markers occurs in ``frames``."""
    for label, markers in BUCKETS:
        if any(marker in frame for frame in frames for marker in markers):
            return label
    return "other"


def breakdown(stacks: list[tuple[list[str], int]]) -> str:
    """The report: buckets, cross-cutting costs and the top leaf functions."""
    total = sum(count for _, count in stacks) or 1
    buckets: Counter[str] = Counter()
    across: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for frames, count in stacks:
        label = bucket_of(frames)
        buckets[label] += count
        for name, markers in ACROSS:
            if any(marker in frame for frame in frames for marker in markers):
                across[name] += count
        if label != IDLE:
            leaves[frames[-1]] += count
    busy = total - buckets[IDLE] or 1
    lines = [f"{total} samples; busy (not idle) {busy} = {busy / total:.0%}", "",
             f"{'bucket':<52} {'of all':>7} {'of busy':>8}"]
    for label, count in buckets.most_common():
        share = "" if label == IDLE else f"{count / busy:8.1%}"
        lines.append(f"{label:<52} {count / total:7.1%} {share}")
    lines += ["", f"{'across buckets (inclusive)':<52} {'of all':>7} {'of busy':>8}"]
    lines += [f"{name:<52} {count / total:7.1%} {count / busy:8.1%}"
              for name, count in across.most_common()]
    lines += ["", "top leaf frames (busy samples):"]
    lines += [f"  {count / busy:6.1%}  {frame}" for frame, count in leaves.most_common(15)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Profile one core drain and print where the worker's time went."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--log-level", help="the worker's --log-level (default: its own)")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--native", action="store_true", help="also sample C frames")
    parser.add_argument("--out", type=Path, default=Path("/tmp/akadze-profile"))
    parser.add_argument("--admin-url")
    parser.add_argument("--database", default=f"{db.DEFAULT_NAME}_profile")
    parser.add_argument("--stacks", type=Path, help="only analyse this py-spy raw file")
    options = parser.parse_args(argv)
    if options.stacks:
        print(breakdown(read_stacks(options.stacks)))
        return
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    procs.install_cleanup()
    options.out.mkdir(parents=True, exist_ok=True)
    stacks = options.out / f"drain-{options.jobs}-{options.slots}-" \
                           f"{(options.log_level or 'default').lower()}.txt"
    recorders: list[subprocess.Popen[bytes]] = []

    def attach(worker: subprocess.Popen[bytes]) -> None:
        argv = [spy, "record", "--pid", str(worker.pid), "--rate", str(options.rate),
                "--idle", "--format", "raw", "-o", str(stacks)]
        recorders.append(procs.start([*argv, "--native"] if options.native else argv,
                                     log=options.out / "py-spy.log"))

    admin = db.admin_url(options.admin_url)
    url = db.recreate(admin, options.database)
    try:
        result = core.core_drain(url, options.jobs, slots=options.slots, run_dir=options.out,
                                 log_level=options.log_level, on_start=attach)
    finally:
        for recorder in recorders:
            try:
                recorder.wait(60)  # py-spy writes its file once the worker has exited
            finally:
                procs.stop(recorder)
        db.drop(admin, options.database)
    print(f"drain: {result.succeeded:,} jobs in {result.seconds:.1f}s = {result.rate:,.0f} "
          f"jobs/s; worker CPU {result.worker_cpu:.1f}s, Postgres backends "
          f"{result.postgres_cpu:.1f}s; load {procs.load_average()}")
    print(f"stacks: {stacks} (speedscope.app opens this collapsed format)\n")
    print(breakdown(read_stacks(stacks)))


if __name__ == "__main__":
    main()
