"""``python -m bench``: run the workloads and print one table of figures and ratios.

Every figure and its comparison are measured in the same run, on this machine. Sizes are
``--quick`` (about two minutes) or the fuller defaults; each can be overridden. The
benchmark works in its own database (``akadze_bench``, dropped and created again) and
stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import (
    canvas,
    ceiling,
    celery_side,
    claim,
    compat,
    concurrent,
    core,
    dashboard,
    db,
    enqueue,
    limits,
    metrics,
    oban_side,
    pgbouncer,
    procs,
    schedules,
    table,
)
from .drain import DrainResult

RESULTS = Path(__file__).resolve().parent / "results.md"
WORKLOADS = ("enqueue", "concurrent", "bulk", "latency", "claim", "core", "ceiling",
             "pgbouncer", "memory", "sweep", "compat", "celery", "oban", "canvas", "schedules",
             "metrics", "dashboard", "limits")


@dataclass(frozen=True)
class Sizes:
    """How big each workload is."""

    drain_jobs: int        # the core drain (throughput)
    memory_jobs: int       # the long core drain (RSS and throughput over time)
    sweep_jobs: int        # the other core drains (more slots, quieter logging)
    compat_jobs: int
    celery_jobs: int
    single_enqueue: int
    bulk_jobs: int
    bulk_batch: int
    latency_samples: int
    claim_small: int
    claim_large: int
    claim_future: int
    claims: int
    canvas_members: int    # the core group enqueue, fan-in and statement counts
    canvas_steps: int      # the chain
    canvas_chord: int      # the chord of Celery and of akadze-compat (the same size)
    schedules: int          # runtime schedules of the schedules workload
    schedule_seconds: int   # each of its two phases (spans minute boundaries)
    metrics_jobs: int       # the metrics workload's table
    metrics_failed: int     # ... of which failed
    metrics_renders: int    # render_metrics calls timed
    metrics_drain: int      # no-ops drained per phase, with and without scrapes
    dashboard_jobs: int     # the dashboard's table (1% of them failed)
    oban_jobs: int          # Oban's drain and akadze's beside it, per round
    oban_rounds: int        # ... taking turns, the figures are medians
    limits_jobs: int = 20_000   # each drain of the limits workload's cost part
    limits_exact: int = 2_000   # the 4 workers' drain under a binding rate limit
    limits_rate: int = 200      # ... that rate, per second
    limits_rounds: int = 2      # the cost part's turns, the figures are medians
    ceiling_jobs: int = 20_000  # each ceiling run and each of its 16 `--slots 64` drains


QUICK = Sizes(drain_jobs=20_000, memory_jobs=20_000, sweep_jobs=5_000, compat_jobs=5_000,
              celery_jobs=5_000, single_enqueue=2_000, bulk_jobs=50_000, bulk_batch=5_000,
              latency_samples=100, claim_small=10_000, claim_large=200_000,
              claim_future=100_000, claims=200, canvas_members=5_000, canvas_steps=300,
              canvas_chord=2_000, schedules=10_000, schedule_seconds=65,
              metrics_jobs=1_000_000, metrics_failed=10_000, metrics_renders=50,
              metrics_drain=10_000, dashboard_jobs=200_000, oban_jobs=10_000, oban_rounds=1,
              ceiling_jobs=2_000)
FULL = Sizes(drain_jobs=200_000, memory_jobs=1_000_000, sweep_jobs=20_000, compat_jobs=50_000,
             celery_jobs=20_000, single_enqueue=10_000, bulk_jobs=200_000, bulk_batch=10_000,
             latency_samples=200, claim_small=10_000, claim_large=1_000_000,
             claim_future=100_000, claims=300, canvas_members=10_000, canvas_steps=1_000,
             canvas_chord=10_000, schedules=10_000, schedule_seconds=125,
             metrics_jobs=1_000_000, metrics_failed=10_000, metrics_renders=200,
             metrics_drain=30_000, dashboard_jobs=1_000_000, oban_jobs=20_000,
             oban_rounds=3)


@dataclass
class Failed:
    """A workload that could not run or did not finish, and why (exit code 1)."""

    reason: str


@dataclass
class Skipped:
    """A workload whose subject is absent (the facade's CLI, a broker), and why."""

    reason: str


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``python -m bench --help``)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, about two minutes")
    parser.add_argument("--only", metavar="LIST",
                        help=f"comma-separated workloads to run, of: {', '.join(WORKLOADS)}")
    parser.add_argument("--skip", metavar="LIST", default="", help="workloads not to run")
    for field in fields(Sizes):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=int, metavar="N",
                            help=f"override the size {field.name}")
    parser.add_argument("--core-slots", type=int, default=10, metavar="N",
                        help="--slots of the core drain (default 10)")
    parser.add_argument("--memory-slots", type=int, default=100, metavar="N",
                        help="--slots of the long drain that measures the worker's memory "
                             "(default 100, the fastest setting)")
    parser.add_argument("--sweep-slots", default="1,100", metavar="LIST",
                        help="--slots of the extra, shorter core drains (default 1,100; "
                             "1 is the CLI's default)")
    cores = os.cpu_count() or 2
    parser.add_argument("--prefork", type=int, default=cores, metavar="N",
                        help=f"prefork concurrency, Celery and akadze-compat (default {cores})")
    parser.add_argument("--threads", type=int, default=10, metavar="N",
                        help="threads concurrency, Celery and akadze-compat (default 10)")
    parser.add_argument("--wide-threads", type=int, default=50, metavar="N",
                        help="one more akadze-compat threads drain at this concurrency "
                             "(default 50; 0 skips it)")
    parser.add_argument("--oban-limit", type=int, default=64, metavar="N",
                        help="Oban's queue limit (`oban start --queues bench:N`) and the "
                             "--slots of the akadze drain beside it (default 64)")
    parser.add_argument("--canvas-slots", type=int, default=10, metavar="N",
                        help="--slots of the canvas workload's idle worker (default 10)")
    parser.add_argument("--admin-url", help=f"Postgres admin URL (default ${db.ADMIN_URL_ENV} "
                                            f"or {db.DEFAULT_ADMIN_URL})")
    parser.add_argument("--database", default=db.DEFAULT_NAME,
                        help=f"benchmark database name, {db.NAME_PREFIX}* (dropped first)")
    parser.add_argument("--keep-database", action="store_true", help="do not drop it at the end")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where to write the Markdown table (default bench/results.md)")
    parser.add_argument("--run-dir", type=Path,
                        help="logs and raw results (default /tmp/akadze-bench-<time>)")
    options = parser.parse_args(argv)
    sizes = QUICK if options.quick else FULL
    overrides = {f.name: getattr(options, f.name) for f in fields(Sizes)
                 if getattr(options, f.name) is not None}
    options.sizes = replace(sizes, **overrides)
    chosen = options.only.split(",") if options.only else list(WORKLOADS)
    skipped = set(filter(None, options.skip.split(",")))
    unknown = (set(chosen) | skipped) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    options.workloads = [name for name in WORKLOADS if name in chosen and name not in skipped]
    options.sweep = [int(value) for value in options.sweep_slots.split(",") if value.strip()]
    return options


class Bench:
    """One run: its database, run directory, results and load notes."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.sizes: Sizes = options.sizes
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir: Path = options.run_dir or Path(f"/tmp/akadze-bench-{stamp}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.admin = db.admin_url(options.admin_url)
        self.url = ""
        self.results: dict[str, Any] = {}
        self.loads: list[tuple[str, float, str, str]] = []

    def run(self) -> int:
        """Run the chosen workloads, print and write the table; 1 if any workload failed."""
        started = procs.load_average()
        print(f"akadze bench: logs in {self.run_dir}; load average {started}", flush=True)
        self.url = db.recreate(self.admin, self.options.database)
        try:
            self.facts = machine_facts(self.url)
            for name in self.options.workloads:
                self._step(name, getattr(self, f"_{name}"))
        finally:
            if not self.options.keep_database:
                db.drop(self.admin, self.options.database)
        rows = table.rows(self.results, self.sizes, self.options)
        text = table.document(rows, self.results, self.facts, self.loads, started,
                              procs.load_average(), self.options)
        print("\n" + text, flush=True)
        self.options.results.write_text(text)
        (self.run_dir / "results.json").write_text(json.dumps(
            _plain(self.results), indent=2, default=str))
        print(f"\nwritten to {self.options.results}", flush=True)
        return 1 if any(isinstance(v, Failed) for v in _leaves(self.results)) else 0

    def _step(self, name: str, step: Callable[[], None]) -> None:
        before = procs.load_average()
        print(f"[{name}] running (load {before})", flush=True)
        clock = time.monotonic()
        try:
            step()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.results.setdefault(name, Failed(f"{type(exc).__name__}: {exc}"))
        took = time.monotonic() - clock
        after = procs.load_average()
        self.loads.append((name, took, before, after))
        print(f"[{name}] done in {took:.0f}s (load {after})", flush=True)

    # --- the workloads -----------------------------------------------------------------------

    def _enqueue(self) -> None:
        self.results["enqueue"] = enqueue.single_enqueue(self.url, self.sizes.single_enqueue)

    def _concurrent(self) -> None:
        self.results["concurrent"] = concurrent.concurrent_enqueue(self.url)

    def _bulk(self) -> None:
        self.results["bulk"] = enqueue.bulk_enqueue(self.url, self.sizes.bulk_jobs,
                                                    batch=self.sizes.bulk_batch)

    def _latency(self) -> None:
        self.results["latency"] = core.latency(self.url, self.sizes.latency_samples,
                                               slots=self.options.core_slots,
                                               run_dir=self.run_dir)

    def _claim(self) -> None:
        small = self.sizes.claim_small
        self.results["claim"] = claim.claim_latency(self.admin, self.options.database, [
            claim.Scenario("small", small),
            claim.Scenario("future", small, future=self.sizes.claim_future),
            claim.Scenario("large", self.sizes.claim_large),
            claim.Scenario("drained", small, finished=self.sizes.claim_large),
        ], claims=self.sizes.claims)

    def _core(self) -> None:
        self.results["core"] = core.core_drain(self.url, self.sizes.drain_jobs,
                                               slots=self.options.core_slots,
                                               run_dir=self.run_dir)

    def _ceiling(self) -> None:
        result = ceiling.ceiling_workload(self.admin, self.options.database,
                                          self.sizes.ceiling_jobs, run_dir=self.run_dir)
        self.results["ceiling"] = result
        if result.failures:  # its rows say so; the exit code too, as for any failed drain
            self.results["ceiling failures"] = Failed("; ".join(result.failures))

    def _pgbouncer(self) -> None:
        try:
            pgbouncer.binary()
        except pgbouncer.PgBouncerUnavailable as exc:
            self.results["pgbouncer"] = Skipped(str(exc))
            return
        self.results["pgbouncer"] = pgbouncer.pgbouncer_drain(
            self.url, self.sizes.drain_jobs, slots=self.options.core_slots,
            run_dir=self.run_dir)

    def _memory(self) -> None:
        self.results["memory"] = core.core_drain(self.url, self.sizes.memory_jobs,
                                                 slots=self.options.memory_slots,
                                                 run_dir=self.run_dir, label="memory-drain")

    def _sweep(self) -> None:
        results: dict[str, Any] = {}
        self.results["sweep"] = results
        jobs = self.sizes.sweep_jobs
        for slots in self.options.sweep:
            results[f"slots {slots}"] = _attempt(lambda slots=slots: core.core_drain(
                self.url, jobs, slots=slots, run_dir=self.run_dir))
        results["quiet"] = _attempt(lambda: core.core_drain(
            self.url, jobs, slots=self.options.core_slots, run_dir=self.run_dir,
            log_level="WARNING"))
        results["default"] = _attempt(lambda: core.core_drain(
            self.url, jobs, slots=self.options.core_slots, run_dir=self.run_dir))

    def _compat(self) -> None:
        argv, why = compat.availability(self.url, self.run_dir / "compat-probe.log")
        if argv is None:
            self.results["compat"] = Skipped(why)
            return
        results: dict[str, Any] = {}
        self.results["compat"] = results
        for key, pool, concurrency in compat.pools(self.options):
            results[key] = _attempt(lambda pool=pool, concurrency=concurrency:
                                    compat.compat_drain(
                                        self.url, argv, self.sizes.compat_jobs, pool=pool,
                                        concurrency=concurrency, run_dir=self.run_dir))

    def _schedules(self) -> None:
        self.results["schedules"] = schedules.schedules_workload(
            self.url, self.sizes.schedules, self.sizes.schedule_seconds, run_dir=self.run_dir)

    def _metrics(self) -> None:
        sizes = self.sizes
        self.results["metrics"] = metrics.metrics_workload(
            self.admin, self.options.database, jobs=sizes.metrics_jobs,
            failed=sizes.metrics_failed, renders=sizes.metrics_renders,
            drain_jobs=sizes.metrics_drain, run_dir=self.run_dir)

    def _dashboard(self) -> None:
        jobs = self.sizes.dashboard_jobs
        self.results["dashboard"] = dashboard.dashboard_workload(self.url, jobs, jobs // 100)

    def _limits(self) -> None:
        sizes = self.sizes
        self.results["limits"] = limits.limits_workload(
            self.url, sizes.limits_jobs, sizes.limits_exact, rate=sizes.limits_rate,
            rounds=sizes.limits_rounds, run_dir=self.run_dir)

    def _celery(self) -> None:
        results: dict[str, Any] = {}
        self.results["celery"] = results
        try:
            python = celery_side.celery_python(self.run_dir / "celery-venv.log")
        except celery_side.CeleryUnavailable as exc:
            self.results["celery"] = Failed(str(exc))
            return
        for broker, url in celery_side.BROKERS.items():
            for pool, concurrency in (("prefork", self.options.prefork),
                                      ("threads", self.options.threads)):
                key = f"{broker} {pool}"
                if not celery_side.reachable(url):
                    results[key] = Skipped(f"{broker} not reachable at {url}")
                    continue
                results[key] = _attempt(lambda url=url, pool=pool, concurrency=concurrency:
                                        celery_side.celery_drain(celery_side.CeleryRun(
                                            python, url, pool, concurrency,
                                            self.sizes.celery_jobs, self.run_dir)))

    def _oban(self) -> None:
        try:
            python = oban_side.oban_python(self.run_dir / "oban-venv.log")
        except oban_side.ObanUnavailable as exc:
            print(f"[oban] skipped: {exc}", flush=True)
            self.results["oban"] = Skipped(str(exc))
            return
        results: dict[str, Any] = {}
        self.results["oban"] = results
        jobs, limit = self.sizes.oban_jobs, self.options.oban_limit
        # Turns, the order swapped every round, so that a change of load hits both alike.
        for turn in range(1, self.sizes.oban_rounds + 1):
            sides = ["Oban", "akadze"] if turn % 2 else ["akadze", "Oban"]
            for side in sides:
                if side == "Oban":
                    results[f"Oban round {turn}"] = _attempt(
                        lambda turn=turn: self._oban_round(results, python, jobs, limit,
                                                           turn))
                else:
                    results[f"akadze round {turn}"] = _attempt(
                        lambda turn=turn: core.core_drain(
                            self.url, jobs, slots=limit, run_dir=self.run_dir,
                            label=f"akadze-vs-oban-r{turn}"))
        # Enqueue commit -> body start on an idle worker, the latency workload's way.
        samples = self.sizes.latency_samples
        results["Oban latency"] = _attempt(lambda: oban_side.oban_latency(
            python, self.admin, samples, limit=limit, run_dir=self.run_dir,
            database=f"{self.options.database}_oban"))
        results["akadze latency"] = _attempt(lambda: core.latency(
            self.url, samples, slots=limit, run_dir=self.run_dir))

    def _oban_round(self, results: dict[str, Any], python: Path, jobs: int, limit: int,
                    turn: int) -> DrainResult:
        """One Oban drain in its fresh database; its enqueue rate goes beside it."""
        drain, enqueue_rate = oban_side.oban_drain(python, self.admin, jobs, limit=limit,
                                                   run_dir=self.run_dir,
                                                   label=f"oban-drain-r{turn}",
                                                   database=f"{self.options.database}_oban")
        results[f"Oban enqueue_many round {turn}"] = enqueue_rate
        return drain

    def _canvas(self) -> None:
        results: dict[str, Any] = {}
        self.results["canvas"] = results
        sizes = self.sizes
        core_figures = canvas.run_core(
            self.url, members=sizes.canvas_members, steps=sizes.canvas_steps,
            samples=sizes.latency_samples, slots=self.options.canvas_slots,
            run_dir=self.run_dir, attempt=_attempt)
        results["core"] = core_figures
        if core_figures.errors:
            results["core failed"] = Failed("; ".join(
                f"{name}: {why}" for name, why in core_figures.errors.items()))
        if not celery_side.reachable(canvas.CELERY_CANVAS_URL):
            results["celery"] = Skipped(f"Redis not reachable at {canvas.CELERY_CANVAS_URL}")
        else:
            results["celery"] = _attempt(lambda: canvas.celery_chord(
                celery_side.celery_python(self.run_dir / "celery-venv.log"), sizes.canvas_chord,
                concurrency=self.options.prefork, run_dir=self.run_dir))
        argv, why = compat.availability(self.url, self.run_dir / "compat-probe.log")
        missing = why if argv is None else canvas.compat_canvas_available()
        if argv is None or missing is not None:
            results["compat"] = Skipped(missing or why)
        else:
            results["compat"] = _attempt(lambda: canvas.compat_chord(
                self.url, argv, sizes.canvas_chord, concurrency=self.options.prefork,
                run_dir=self.run_dir))


def _attempt(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        return Failed(f"{type(exc).__name__}: {exc}")


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _plain(value: Any) -> Any:
    if isinstance(value, DrainResult):
        return value.as_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def machine_facts(url: str) -> dict[str, str]:
    """What the figures depend on: CPU, memory, Python, Postgres and its settings."""
    facts = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "cpu": _cpu_model(), "cores": str(os.cpu_count()),
             "memory": _memory(), "python": platform.python_version(),
             "system": f"{platform.system()} {platform.release()}"}
    facts["akadze commit"] = _commit()
    facts.update({f"postgres {key}": value for key, value in db.server_facts(url).items()})
    return facts


def _commit() -> str:
    """The repository's HEAD, and whether the engine has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "akadze_core", "akadze_compat"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    note = " (+ uncommitted changes in akadze_core/akadze_compat)" if dirty.stdout else ""
    return head.stdout.strip() + note


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        total = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        return f"{int(total) / 2**20:.1f} GiB"
    except (OSError, IndexError, ValueError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m bench``."""
    options = parse(argv)
    procs.install_cleanup()
    sys.exit(Bench(options).run())
