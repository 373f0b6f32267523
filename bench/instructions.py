"""``python -m bench.instructions``: instructions a job of a real drain's client process.

The core worker (``akadze worker bench.apps.core_app:app --slots 64``) and the raw SQL
ceiling (``bench.ceiling``'s claim loop and completer reduced to their statements) each
drain a backlog of async no-ops twice, at two sizes, under ``valgrind --tool=callgrind``;
the difference of the two ``Collected`` totals over the difference of the sizes is the
instructions a job of that process, start-up and shutdown cancelled out. Postgres itself is
not counted.

A count does not move with the machine's load, as the drains' jobs/s do (±30 % from run to
run here): it shows a change of a few percent of the client's work that ``bench.ab`` cannot.
It is not a speed: the claims and writes under valgrind batch as a drain ~50 times slower
would, so read it for what a change costs or saves, beside ``bench.ab``'s jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import db
from .apps.core_app import NOOP
from .ceiling import SLOTS, _ceiling, _fresh
from .core import worker_argv
from .drain import REPO_ROOT, drain, worker_env

SIDES = ("ceiling", "worker")
SIZES = (2000, 10000)
VALGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
_COLLECTED = re.compile(r"Collected : (\d+)")


def collected(text: str) -> int:
    """The instruction total callgrind printed last in ``text``."""
    found = _COLLECTED.findall(text)
    if not found:
        raise RuntimeError("callgrind printed no 'Collected' total")
    return int(found[-1])


def per_job(counts: tuple[int, int], sizes: tuple[int, int]) -> float:
    """Instructions a job from the totals of drains of ``sizes`` jobs."""
    return (counts[1] - counts[0]) / (sizes[1] - sizes[0])


def _count(side: str, url: str, jobs: int, log: Path, log_level: str | None) -> int:
    db.reset(url)
    db.fill(url, jobs, task=NOOP)
    if side == "worker":
        drain(url, [*VALGRIND, *worker_argv(url, SLOTS, log_level)], jobs=jobs, log=log,
              timeout=1800, env=worker_env(url))
        return collected(log.read_text("utf-8", errors="replace"))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([*VALGRIND, sys.executable, "-m", "bench.instructions",
                           "--ceiling-of", url], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    return collected(done.stderr)


def measure(admin: str, database: str, sides: tuple[str, ...], sizes: tuple[int, int],
            run_dir: Path, log_level: str | None = None) -> dict[str, float]:
    """Instructions a job of each of ``sides``, each in fresh databases of its own."""
    template = db.checked_name(f"{database}_instructions_tpl")
    db.recreate(admin, template)
    result: dict[str, float] = {}
    try:
        for side in sides:
            counts = []
            for jobs in sizes:
                name = f"{database}_instructions_{side}_{jobs}"
                with _fresh(admin, template, name) as url:
                    counts.append(_count(side, url, jobs, run_dir / f"{side}-{jobs}.log",
                                         log_level))
            result[side] = per_job((counts[0], counts[1]), sizes)
    finally:
        db.drop(admin, template)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SIDES),
                        help=f"comma-separated sides: {', '.join(SIDES)}")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="the two drain sizes, jobs (default %(default)s)")
    parser.add_argument("--log-level", help="the worker's --log-level (default: its own)")
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--database", default=db.DEFAULT_NAME)
    parser.add_argument("--out", default="/tmp/akadze-bench-instructions")
    parser.add_argument("--ceiling-of", help=argparse.SUPPRESS)  # the child: one ceiling
    args = parser.parse_args(argv)
    if args.ceiling_of:
        asyncio.run(_ceiling(args.ceiling_of, SLOTS))
        return
    sides = tuple(side.strip() for side in args.only.split(",") if side.strip())
    sizes = tuple(int(size) for size in args.sizes.split(","))
    if any(side not in SIDES for side in sides) or len(sizes) != 2 or sizes[0] >= sizes[1]:
        parser.error(f"--only takes {', '.join(SIDES)}; --sizes two growing job counts")
    if shutil.which("valgrind") is None:
        sys.exit("bench.instructions: valgrind is not installed (apt-get install valgrind)")
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    figures = measure(db.admin_url(args.admin_url), args.database, sides,
                      (sizes[0], sizes[1]), run_dir, args.log_level)
    for side, value in figures.items():
        print(f"{side:8} {value:>10,.0f} instructions a job")
    if len(figures) == 2:
        print(f"worker - ceiling: {figures['worker'] - figures['ceiling']:,.0f} "
              "instructions a job (the worker's own work beside the statements)")


if __name__ == "__main__":
    main()
