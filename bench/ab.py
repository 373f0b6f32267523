"""``python -m bench.ab BASE_REF``: the hot path of this tree against another commit's, in one run.

Builds ``BASE_REF`` (any git ref) into a virtualenv of its own (``git archive`` of the commit,
``pip install`` of that tree and its dependencies; cached per commit hash under
``--cache``, default ``/tmp/akadze-ab``, so a second run starts at once), then drains the
same backlogs with both builds, taking turns, each drain in a fresh database:

- core: ``akadze worker bench.apps.core_app:app --slots 64`` on ``--jobs`` async no-ops;
- compat: ``akadze-compat -A bench.apps.celery_app worker -P prefork -c 2`` on ``--jobs``
  no-ops with their result ignored (one real ``delay()`` row, cloned);
- threads (only when asked, ``--only threads``): the same jobs drained by
  ``akadze-compat ... worker -P threads -c 50`` (``--threads``).

Both builds run the harness of this tree (``bench/``: the fill, the drain, the window read
from the jobs table); only the package under test differs. The base's workers are its
virtualenv's console scripts with only this tree's ``bench`` package on their path (through
a symlink, so its own ``akadze_core`` cannot shadow the base's); the database of a base
drain is migrated and filled by the base's interpreter (its schema, its ``delay()`` row).

Per round it prints each drain's jobs/s and CPU per job (worker and its Postgres
backends); at the end the medians, their ratios work/base and the ratio within each
round. The exit code is 1 when a median ratio of jobs/s is below ``--threshold`` (0.95),
2 when a drain failed. The round order alternates (base
first, then work first) so a change of machine load hits both builds alike; on a busy
machine use more rounds (``--rounds 7``) and read the ratios, not the absolute figures.

``--work REF`` puts a second commit in place of the working tree (for bisecting:
``python -m bench.ab c9aeb60 --work 77e3037``).

``--backlog N`` runs every drain behind ``N`` more due jobs of the same queue, priority and
shape, due since the backlog was made while the drain's own are due since a day earlier
(so the claim, in (priority, scheduled_at, id) order, takes them first, and the backlog
only after the drain), so that what only a big table shows (the plans kept for a session
and their costs, JIT, index depth) is in the figure: a 10,000-job drain on an otherwise
empty table did not show the claim's JIT compilation behind a million jobs. The backlog
must look due, in the drain's priority, to the planner, which estimates ``scheduled_at <=
now()`` and ``priority = $n`` from the statistics: jobs scheduled for later, or at another
priority, cost the kept claim plan less (90,000 behind 1,000,000 at another priority,
under ``jit_above_cost``; 181,000 in this shape, past it from about 550,000). The backlog is
generated once per build and drain kind, by the build's own interpreter into a template
database (one ``INSERT ... SELECT generate_series``, then ANALYZE), and each drain's
database is a copy of it; the drain's figures count only its own jobs.

``--latency N`` alternates the builds on the latency workload instead of the drains
(``bench.core.latency``: an idle ``akadze worker --slots 10``, the full bench's default
``--core-slots``, or ``--latency-slots``; one job enqueued at a time,
enqueue commit to body start, ``N`` samples a round), each build's own client and worker in
a fresh database; it prints each round's p50 and p99, and the p50 of the two halves: enqueue
commit to the claim's start (the job's ``started_at``: the NOTIFY's way, the wake-up) and from
there to the body (the claim, the run's start); the medians and their ratios; and
exits 1 when the median p50 of the work build is above the base's divided by
``--threshold``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from . import db, procs
from .drain import REPO_ROOT, DrainError, DrainResult, drain

DEFAULT_CACHE = Path("/tmp/akadze-ab")
KINDS = ("core", "compat", "threads")
#: The kinds run when ``--only`` is not given.
DEFAULT_KINDS = ("core", "compat")
_READY = ".ab-ready"


@dataclass(frozen=True)
class Build:
    """One side of the comparison: where its interpreter and console scripts are, and the
    directory its workers import ``bench`` (and, for the working tree, akadze) from."""

    label: str
    bin_dir: Path
    path: Path

    def script(self, name: str) -> str:
        """The console script ``name`` of this build."""
        return str(self.bin_dir / name)

    def env(self, url: str) -> dict[str, str]:
        """A worker's environment: the drain's database, this build's import path only."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        env["AKADZE_DATABASE_URL"] = url
        env["PYTHONPATH"] = str(self.path)
        return env


def work_build() -> Build:
    """The working tree, run by this interpreter (its console scripts beside it)."""
    return Build("work", Path(sys.executable).parent, REPO_ROOT)


def resolve(ref: str) -> str:
    """The full commit hash of ``ref``."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.ab: not a commit: {ref!r} ({done.stderr.strip()})")
    return done.stdout.strip()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two runs building the same commit wait
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_ref(ref: str, cache: Path, run_dir: Path, label: str) -> Build:
    """A virtualenv with commit ``ref`` installed (built once per commit hash)."""
    commit = resolve(ref)
    venv = cache / f"venv-{commit[:12]}"
    with _locked(cache / f"venv-{commit[:12]}.lock"):
        if not (venv / _READY).exists():
            print(f"bench.ab: building {ref} ({commit[:12]}) into {venv}", flush=True)
            shutil.rmtree(venv, ignore_errors=True)
            source = cache / f"src-{commit[:12]}"
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir(parents=True)
            archive = subprocess.run(["git", "archive", "--format=tar", commit],
                                     cwd=REPO_ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
            log = run_dir / f"build-{commit[:12]}.log"
            for argv in ([sys.executable, "-m", "venv", str(venv)],
                         [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          str(source)]):
                done = procs.run(argv, log=log, timeout=900)
                if done.returncode != 0:
                    raise SystemExit(f"bench.ab: building {ref} failed: see {log}")
            shutil.rmtree(source, ignore_errors=True)
            (venv / _READY).write_text(commit + "\n")
    # Only ``bench`` importable from here: the base's akadze comes from its site-packages.
    harness = run_dir / f"harness-{commit[:12]}"
    harness.mkdir(parents=True, exist_ok=True)
    link = harness / "bench"
    if not link.exists():
        link.symlink_to(REPO_ROOT / "bench", target_is_directory=True)
    return Build(f"{label} {ref}", venv / "bin", harness)


# --- one drain -----------------------------------------------------------------------------

# Behind a backlog, a drain's jobs are due since a day before it: claimed ahead of it.
AHEAD_OF_BACKLOG = -86_400.0


def prepare(url: str, kind: str, jobs: int, delay_seconds: float = 0.0) -> None:
    """Migrate the database ``url`` and add ``jobs`` queued jobs of ``kind`` to it, due in
    ``delay_seconds`` (run by the build's interpreter)."""
    with psycopg.connect(url, autocommit=True) as connection:
        db.migrate(connection)
    if kind == "core":
        from .apps.core_app import NOOP

        db.fill(url, jobs, task=NOOP, delay_seconds=delay_seconds)
    else:
        from .apps.celery_app import NOOP as COMPAT_NOOP
        from .apps.celery_app import make_app

        app = make_app(url)
        try:
            app.tasks[COMPAT_NOOP].delay(0)
        finally:
            app.close()
        # The row just written is the newest (how a result names its job id has changed
        # between versions; the table has not).
        with psycopg.connect(url, autocommit=True) as connection:
            row = connection.execute("SELECT max(id) FROM akadze.jobs").fetchone()
            assert row is not None and row[0] is not None
            job_id = int(row[0])
            if delay_seconds:
                connection.execute("UPDATE akadze.jobs SET scheduled_at = now()"
                                   " + %s * interval '1 second' WHERE id = %s",
                                   (delay_seconds, job_id))
        db.clone_job(url, job_id, jobs - 1)


def worker_argv(build: Build, kind: str, url: str, slots: int, prefork: int,
                log_level: str | None, threads: int = 50) -> list[str]:
    """The worker command of ``kind`` for ``build``."""
    if kind == "core":
        argv = [build.script("akadze"), "--database-url", url, "worker",
                "bench.apps.core_app:app", "--slots", str(slots)]
    elif kind == "threads":
        argv = [build.script("akadze-compat"), "-A", "bench.apps.celery_app", "worker",
                "-P", "threads", "-c", str(threads)]
    else:
        argv = [build.script("akadze-compat"), "-A", "bench.apps.celery_app", "worker",
                "-P", "prefork", "-c", str(prefork)]
    if log_level:
        argv += ["--log-level" if kind == "core" else "--loglevel", log_level]
    return argv


class Runner:
    """Drains for the builds, each in a database of its own, dropped afterwards."""

    def __init__(self, options: argparse.Namespace, run_dir: Path) -> None:
        self.options = options
        self.run_dir = run_dir
        self.admin = db.admin_url(options.admin_url)
        self.count = 0
        # (build label, kind) -> the template database holding the backlog, its last job id
        self.templates: dict[tuple[str, str], tuple[str, int]] = {}

    def _prepare(self, build: Build, kind: str, url: str, jobs: int, tag: str,
                 delay_seconds: float = 0.0) -> None:
        log = self.run_dir / f"{tag}-prepare.log"
        done = procs.run([build.script("python"), "-m", "bench.ab", "--prepare", kind,
                          url, str(jobs), str(delay_seconds)],
                         log=log, env=build.env(url), cwd=build.path, timeout=1800)
        if done.returncode != 0:
            raise DrainError(f"preparing failed: see {log}")

    def template(self, build: Build, kind: str) -> tuple[str, int]:
        """The template database with ``--backlog`` jobs of ``kind`` written by ``build``
        (made on first use), and the id of its last job."""
        key = (build.label, kind)
        if key not in self.templates:
            name = f"akadze_bench_ab_{os.getpid()}_tpl{len(self.templates) + 1}"
            db.drop(self.admin, name)
            with psycopg.connect(self.admin, autocommit=True) as connection:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            url = db.url_for(self.admin, name)
            started = time.monotonic()
            try:
                self._prepare(build, kind, url, self.options.backlog,
                              f"backlog-{kind}-{build.label.split()[0]}")
            except BaseException:
                db.drop(self.admin, name)
                raise
            with psycopg.connect(url, autocommit=True) as connection:
                row = connection.execute("SELECT max(id) FROM akadze.jobs").fetchone()
            assert row is not None and row[0] is not None
            self.templates[key] = (name, int(row[0]))
            print(f"bench.ab: backlog of {self.options.backlog:,} {kind} jobs for "
                  f"{build.label} in {time.monotonic() - started:.1f}s", flush=True)
        return self.templates[key]

    def drop_templates(self) -> None:
        """Drop the backlog templates."""
        for name, _ in self.templates.values():
            db.drop(self.admin, name)

    def drain(self, build: Build, kind: str) -> DrainResult:
        """One drain of ``kind`` by ``build``, in a fresh database."""
        self.count += 1
        name = f"akadze_bench_ab_{os.getpid()}_{self.count}"
        template, after_id = (self.template(build, kind) if self.options.backlog
                              else ("template1", 0))
        db.drop(self.admin, name)
        with psycopg.connect(self.admin, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        url = db.url_for(self.admin, name)
        tag = f"{self.count:03d}-{kind}-{build.label.split()[0]}"
        try:
            self._prepare(build, kind, url, self.options.jobs, tag,
                          AHEAD_OF_BACKLOG if self.options.backlog else 0.0)
            argv = worker_argv(build, kind, url, self.options.slots, self.options.prefork,
                               self.options.log_level, self.options.threads)
            try:
                return drain(url, argv, jobs=self.options.jobs,
                             log=self.run_dir / f"{tag}.log", timeout=self.options.timeout,
                             whole_tree=kind != "core", env=build.env(url), cwd=build.path,
                             after_id=after_id)
            except OSError as exc:  # e.g. a base too old to have this console script
                raise DrainError(f"cannot start {argv[0]}: {exc}") from exc
        finally:
            db.drop(self.admin, name)


    def latency(self, build: Build) -> dict[str, float]:
        """One latency round of ``build``: its p50, p99, max and mean in milliseconds."""
        self.count += 1
        name = f"akadze_bench_ab_{os.getpid()}_{self.count}"
        tag = f"{self.count:03d}-latency-{build.label.split()[0]}"
        out = self.run_dir / f"{tag}.json"
        url = db.url_for(self.admin, name)
        try:
            done = procs.run([build.script("python"), "-m", "bench.ab", "--latency-run",
                              self.admin, name, str(self.options.latency),
                              str(self.options.latency_slots), str(out)],
                             log=self.run_dir / f"{tag}.log", env=build.env(url),
                             cwd=build.path, timeout=self.options.timeout)
            if done.returncode != 0:
                raise DrainError(f"the latency round failed: see {self.run_dir}/{tag}.log")
            figures: dict[str, float] = json.loads(out.read_text())
            return figures
        finally:
            db.drop(self.admin, name)


def latency_run(admin: str, name: str, samples: int, slots: int, out: Path) -> None:
    """The latency workload in database ``name`` (run by the build's interpreter, whose
    worker and client it measures); its figures written to ``out`` as JSON."""
    from . import core

    url = db.recreate(admin, name)
    here = Path.cwd()
    result = core.latency(url, samples, slots=slots, run_dir=out.parent,
                          env=dict(os.environ, AKADZE_DATABASE_URL=url), cwd=here)
    out.write_text(json.dumps({"p50": result.p50, "p99": result.p99, "max": result.max,
                               "mean": result.mean, "to claim": result.to_claim_p50,
                               "claim to body": result.claim_to_body_p50}))


def summarize_latency(figures: dict[str, list[dict[str, float]]], labels: Sequence[str],
                      threshold: float) -> tuple[list[str], bool]:
    """The table of median p50/p99 and ratios, and whether the work's p50 holds."""
    base, work = labels
    lines = [f"{'latency ms':14} {'base':>8} {'work':>8} {'ratio':>7}  ratios by round"]
    held = True
    for key in ("p50", "p99", "to claim", "claim to body"):
        if any(f.get(key) is None for side in (base, work) for f in figures[side]):
            continue  # a harness from before the halves were kept
        medians = [statistics.median(f[key] for f in figures[side]) for side in (base, work)]
        ratio = medians[1] / medians[0] if medians[0] > 0 else float("nan")
        rounds = " ".join(f"{w[key] / b[key]:.2f}" if b[key] > 0 else "n/a"
                          for b, w in zip(figures[base], figures[work], strict=False))
        flag = ""
        if key == "p50" and ratio > 1 / threshold:
            held = False
            flag = f"  > 1/{threshold}: REGRESSION"
        lines.append(f"{key:14} {medians[0]:8.2f} {medians[1]:8.2f} {ratio:7.3f}"
                     f"  {rounds}{flag}")
    return lines, held


def run_latency(options: argparse.Namespace, runner: Runner,
                builds: tuple[Build, Build]) -> int:
    """The ``--latency`` comparison: rounds alternating the builds' order."""
    figures: dict[str, list[dict[str, float]]] = {build.label: [] for build in builds}
    failed = False
    for number in range(options.rounds):
        for build in builds if number % 2 == 0 else builds[::-1]:
            try:
                result = runner.latency(build)
            except DrainError as exc:
                print(f"round {number + 1} latency {build.label}: FAILED {exc}", flush=True)
                failed = True
                continue
            figures[build.label].append(result)
            print(f"round {number + 1} latency {build.label:24} p50 {result['p50']:6.2f} ms"
                  f"  p99 {result['p99']:6.2f} ms  max {result['max']:6.2f} ms"
                  f"  (p50 to claim {result['to claim']:.2f}, claim to body"
                  f" {result['claim to body']:.2f})  load {procs.load_average()}", flush=True)
    if failed or not all(figures.values()):
        return 2
    lines, held = summarize_latency(figures, [b.label for b in builds], options.threshold)
    print(f"\nmedians of {options.rounds} rounds of {options.latency} samples, load "
          f"{procs.load_average()} (ratio = {builds[1].label} / {builds[0].label}):")
    print("\n".join(lines))
    if options.json:
        options.json.write_text(json.dumps({"latency": figures}, indent=2))
    return 0 if held else 1


# --- the run -------------------------------------------------------------------------------

def cpu_us(result: DrainResult) -> float:
    """CPU per job succeeded, microseconds: the worker (its process tree) over the drain's
    window, sampled every 0.25 s, plus its Postgres backends over their lives (coarse on a
    short drain; less moved by the machine's load than the wall-clock rate)."""
    spent = (result.worker_cpu or 0.0) + (result.postgres_cpu or 0.0)
    return 1e6 * spent / max(result.succeeded, 1)


#: Resamples of ``interval``; its generator is seeded, so the same rounds give the same
#: interval.
RESAMPLES = 2000


def interval(base: Sequence[float], work: Sequence[float],
             resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 95 % interval of the ratio of medians ``work / base`` of paired rounds (the
    rounds resampled with replacement, a pair at a time): how far a ratio of this run's
    rounds could move by chance, so that a ratio near the threshold is read with it."""
    pairs = list(zip(base, work, strict=False))
    if len(pairs) < 2:
        ratio = work[0] / base[0] if pairs else float("nan")
        return ratio, ratio
    draw = random.Random(0)
    ratios = sorted(
        statistics.median(w for _, w in sample) / statistics.median(b for b, _ in sample)
        for sample in ([draw.choice(pairs) for _ in pairs] for _ in range(resamples)))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def summarize(figures: dict[str, dict[str, list[DrainResult]]], labels: Sequence[str],
              threshold: float) -> tuple[list[str], bool]:
    """The table of medians and ratios, and whether every ratio holds ``threshold``."""
    base, work = labels
    lines = [f"{'drain':8} {'base jobs/s':>12} {'work jobs/s':>12} {'ratio':>7}"
             f" {'95 % interval':>13} {'cpu us/job':>17} {'ratio':>6}"
             "  ratios of jobs/s by round"]
    held = True
    for kind, sides in figures.items():
        if not sides[base] or not sides[work]:
            continue
        rates = [statistics.median(r.rate for r in sides[side]) for side in (base, work)]
        ratio = rates[1] / rates[0]
        cpus = [statistics.median(cpu_us(r) for r in sides[side]) for side in (base, work)]
        rounds = " ".join(f"{w.rate / b.rate:.2f}" for b, w in zip(sides[base], sides[work],
                                                                 strict=False))
        low, high = interval([r.rate for r in sides[base]], [r.rate for r in sides[work]])
        held = held and ratio >= threshold
        flag = "" if ratio >= threshold else f"  < {threshold}: REGRESSION"
        lines.append(f"{kind:8} {rates[0]:12,.0f} {rates[1]:12,.0f} {ratio:7.3f}"
                     f" {f'{low:.3f}-{high:.3f}':>13}"
                     f" {cpus[0]:8,.0f}→{cpus[1]:<8,.0f} {cpus[1] / (cpus[0] or 1):6.3f}"
                     f"  {rounds}{flag}")
    return lines, held


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the git ref to compare against (e.g. main, c9aeb60)")
    parser.add_argument("--work", metavar="REF",
                        help="a second ref in place of the working tree (bisecting)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (≥ 3 to judge; 5)")
    # 5,000-job drains last half a second at 10,000 jobs/s: identical builds swung 0.88-1.04.
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per drain (20000)")
    parser.add_argument("--backlog", type=int, default=0, metavar="N",
                        help="drain behind N more due jobs (0); 1000000 shows the plans"
                             " of a full-size table")
    parser.add_argument("--latency", type=int, default=0, metavar="N",
                        help="alternate the builds on the latency workload instead, N samples"
                             " a round (200 is the full bench's)")
    parser.add_argument("--latency-slots", type=int, default=10,
                        help="the latency worker's --slots (10, as python -m bench)")
    parser.add_argument("--only", default=",".join(DEFAULT_KINDS),
                        help="of core,compat,threads (core,compat)")
    parser.add_argument("--slots", type=int, default=64, help="core worker --slots (64)")
    parser.add_argument("--prefork", type=int, default=2, help="compat prefork -c (2)")
    parser.add_argument("--threads", type=int, default=50, help="compat threads -c (50)")
    parser.add_argument("--log-level", help="the workers' log level (their CLI default)")
    parser.add_argument("--threshold", type=float, default=0.95,
                        help="exit 1 below this median ratio of jobs/s (0.95)")
    parser.add_argument("--timeout", type=float, default=600, help="per drain, seconds")
    parser.add_argument("--admin-url", help="Postgres admin URL (local postgres)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help=f"where built virtualenvs are kept ({DEFAULT_CACHE})")
    parser.add_argument("--run-dir", type=Path, help="logs (default /tmp/akadze-ab/run-<time>)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    options = parser.parse_args(argv)
    kinds = [k for k in options.only.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        parser.error(f"--only takes {','.join(KINDS)}")
    options.kinds = kinds
    if options.rounds < 1 or options.jobs < 1:
        parser.error("--rounds and --jobs must be positive")
    if options.backlog < 0:
        parser.error("--backlog cannot be negative")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; see the module's docstring."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--prepare"]:  # inside a build's interpreter
        prepare(args[2], args[1], int(args[3]), float(args[4]) if len(args) > 4 else 0.0)
        return 0
    if args[:1] == ["--latency-run"]:  # inside a build's interpreter
        latency_run(args[1], args[2], int(args[3]), int(args[4]), Path(args[5]))
        return 0
    options = parse(args)
    stamp = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir = options.run_dir or options.cache / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    procs.install_cleanup()
    base = build_ref(options.base, options.cache, run_dir, "base")
    work = (build_ref(options.work, options.cache, run_dir, "work") if options.work
            else work_build())
    builds = (base, work)
    labels = (base.label, work.label)
    behind = f" behind {options.backlog:,} due jobs" if options.backlog else ""
    what = (f"latency, {options.latency} samples" if options.latency
            else f"{options.jobs} jobs{behind}")
    print(f"bench.ab: {base.label} vs {work.label}: {options.rounds} rounds of {what},"
          f" load {procs.load_average()}; logs in {run_dir}", flush=True)
    runner = Runner(options, run_dir)
    if options.latency:
        return run_latency(options, runner, builds)
    figures: dict[str, dict[str, list[DrainResult]]] = {
        kind: {label: [] for label in labels} for kind in options.kinds}
    failed = False
    try:
        for number in range(options.rounds):
            order = builds if number % 2 == 0 else builds[::-1]
            for kind in options.kinds:
                for build in order:
                    try:
                        result = runner.drain(build, kind)
                    except DrainError as exc:
                        print(f"round {number + 1} {kind:6} {build.label}: FAILED {exc}",
                              flush=True)
                        failed = True
                        continue
                    figures[kind][build.label].append(result)
                    print(f"round {number + 1} {kind:6} {build.label:24}"
                          f" {result.rate:10,.0f} jobs/s  cpu {cpu_us(result):5,.0f} us/job"
                          f"  ({result.succeeded}/{result.jobs} in {result.seconds:.2f}s)",
                          flush=True)
    finally:
        runner.drop_templates()
    lines, held = summarize(figures, labels, options.threshold)
    print(f"\nmedians of {options.rounds} rounds, load {procs.load_average()}"
          f" (ratio = {work.label} / {base.label}):")
    print("\n".join(lines))
    if options.json:
        options.json.write_text(json.dumps({
            "base": base.label, "work": work.label, "jobs": options.jobs,
            "rounds": options.rounds,
            "figures": {kind: {label: [r.as_dict() for r in results]
                               for label, results in sides.items()}
                        for kind, sides in figures.items()}}, indent=2))
    if failed:
        return 2
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
