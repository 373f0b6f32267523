"""``python -m bench.pgjqb``: the independent pgjqb harness, natively, akadze vs the others.

The harness is hardbyte/postgresql-job-queue-benchmarking (not part of this repository):
taken from ``--harness`` / ``$PGJQB_HARNESS``, a bare git directory (the default, the
mirror below), a checkout, or a clone URL. Its ``bench_harness`` package runs every cell
(phases, chaos hooks, metrics daemon, summary.json); ``native.py`` swaps its Docker parts
for a private Postgres 15 cluster per system and per cell and for plain subprocesses.

Each cell runs one system at a time (``--systems``) on a fresh cluster, then the table of
the key figures of every cell is printed and written to ``--results``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import oban_side
from bench.pgjqb.table import render

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HARNESS = "/work/.mirror/hardbyte+postgresql-job-queue-benchmarking/repo"
# What the native run needs of the harness (its results/ is large and not needed).
HARNESS_PATHS = ["bench_harness", "postgres.conf", "procrastinate-bench", "pyproject.toml",
                 "README.md", "docs"]
VENV_PACKAGES = ["psycopg[binary]>=3.2", "psycopg-pool>=3.2", "pydantic>=2",
                 "matplotlib>=3.9", "pandas>=2.2", "numpy>=2.0", "procrastinate==3.8.1"]


def cells(scale: float, cell_scale: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The cells, after the harness's own sweep (scripts/run_full_sweep.sh), shortened:
    durations in seconds are multiplied by ``scale`` (by ``cell_scale[name]`` for the cells
    it names), never under 6 s."""
    return [_scaled(cell, (cell_scale or {}).get(cell["name"], scale))
            for cell in _cells()]


def _scaled(cell: dict[str, Any], scale: float) -> dict[str, Any]:
    def scaled(spec: str) -> str:
        label, rest = spec.rsplit(":", 1)
        out = f"{label}:{max(6, round(int(rest.rstrip('s')) * scale))}s"
        # repeated-kill's period is a duration too.
        if "period=" in out:
            head, tail = out.split("period=", 1)
            period, after = tail.split(")", 1)
            out = f"{head}period={max(6, round(int(period.rstrip('s')) * scale))}s){after}"
        return out

    return {**cell, "phases": [scaled(spec) for spec in cell["phases"]]}


def _cells() -> list[dict[str, Any]]:
    """The cells at scale 1."""

    def s(seconds: float) -> str:
        return f"{round(seconds)}s"

    def chaos(name: str, middle: list[str], rate: int, replicas: int) -> dict[str, Any]:
        return {"name": name, "kind": "chaos", "rate": rate, "replicas": replicas,
                "phases": [f"warmup=warmup:{s(10)}", f"baseline=clean:{s(20)}", *middle,
                           f"recovery=clean:{s(30)}"]}

    return [
        {"name": "throughput", "kind": "throughput", "mode": "depth-target",
         "target_depth": 4000, "rate": 50000, "workers": 64,
         "phases": [f"warmup=warmup:{s(10)}", f"clean=clean:{s(30)}"]},
        {"name": "pickup_latency", "kind": "latency", "rate": 500, "workers": 32,
         "phases": [f"warmup=warmup:{s(10)}", f"clean=clean:{s(30)}"]},
        chaos("chaos_postgres_restart", [f"restart=postgres-restart:{s(20)}"], 600, 1),
        chaos("chaos_pg_backend_kill", [f"kills=pg-backend-kill(rate=2):{s(20)}"], 600, 1),
        chaos("chaos_pool_exhaustion",
              [f"exhaustion=pool-exhaustion(idle_conns=300):{s(20)}"], 600, 1),
        chaos("chaos_crash_recovery", [f"kill=kill-worker(instance=0):{s(15)}",
                                       f"restart=start-worker(instance=0):{s(15)}"], 300, 2),
        chaos("chaos_repeated_kills",
              [f"repeated=repeated-kill(instance=0,period={s(10)}):{s(30)}"], 300, 2),
        {"name": "idle_in_tx", "kind": "pressure", "rate": 800, "workers": 32,
         "phases": [f"warmup=warmup:{s(10)}", f"clean_1=clean:{s(20)}",
                    f"idle_1=idle-in-tx:{s(60)}", f"recovery_1=recovery:{s(30)}"]},
        {"name": "sustained_high_load", "kind": "pressure", "rate": 800, "workers": 32,
         "phases": [f"warmup=warmup:{s(10)}", f"clean_1=clean:{s(20)}",
                    f"pressure_1=high-load:{s(60)}", f"recovery_1=clean:{s(30)}"]},
        {"name": "active_readers", "kind": "pressure", "rate": 800, "workers": 32,
         "phases": [f"warmup=warmup:{s(10)}", f"clean_1=clean:{s(20)}",
                    f"readers_1=active-readers:{s(60)}", f"recovery_1=clean:{s(30)}"]},
    ]


DEFAULT_CELLS = ["throughput", "pickup_latency", "chaos_postgres_restart",
                 "chaos_pg_backend_kill", "chaos_pool_exhaustion", "chaos_crash_recovery",
                 "chaos_repeated_kills", "idle_in_tx", "sustained_high_load"]


def phase_seconds(cell: dict[str, Any]) -> int:
    """The sum of the cell's phase durations."""
    return sum(int(spec.rsplit(":", 1)[1].rstrip("s")) for spec in cell["phases"])


def get_harness(source: str, work: Path) -> Path | None:
    """A working copy of the harness under ``work``; None (said in one line) if absent."""
    src = Path(source)
    if (src / "bench_harness").is_dir():
        return src
    dest = work / "harness"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if src.is_dir() and (src / "HEAD").exists():
        # A bare repository: export only what the run needs.
        archive = subprocess.run(["git", "-C", str(src), "archive", "HEAD", *HARNESS_PATHS],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            print(f"pgjqb: cannot read the harness at {source}", file=sys.stderr)
            return None
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    elif "://" in source or source.startswith("git@"):
        clone = subprocess.run(["git", "clone", "--depth", "1", source, str(dest)],
                               capture_output=True, text=True, check=False)
        if clone.returncode != 0:
            print(f"pgjqb: cannot clone the harness from {source}", file=sys.stderr)
            return None
    else:
        print(f"pgjqb: the harness is absent ({source}); pass --harness PATH_OR_URL or set "
              "PGJQB_HARNESS", file=sys.stderr)
        return None
    rev = subprocess.run(["git", "-C", str(src if src.is_dir() else dest), "rev-parse",
                          "HEAD"], capture_output=True, text=True, check=False)
    (dest / ".pgjqb_revision").write_text(rev.stdout.strip())
    return dest


def harness_revision(harness: Path) -> str:
    """The harness's git commit, as recorded when it was exported (or read from it)."""
    marker = harness / ".pgjqb_revision"
    if marker.exists():
        return marker.read_text().strip()
    out = subprocess.run(["git", "-C", str(harness), "rev-parse", "HEAD"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def ensure_venv(venv: Path, with_awa: bool) -> Path:
    """The harness's virtualenv (its deps + Procrastinate, awa-pg if asked); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    check = subprocess.run([str(python), "-c", "import procrastinate, pandas, pydantic"],
                           capture_output=True, check=False)
    if check.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *VENV_PACKAGES],
                       check=True)
    if with_awa:
        has = subprocess.run([str(python), "-c", "import awa"], capture_output=True,
                             check=False)
        if has.returncode != 0:
            subprocess.run([str(python), "-m", "pip", "install", "-q", "awa-pg"], check=False)
    return python


def load_average() -> str:
    """The 1/5/15-minute load averages."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_cell(cell: dict[str, Any], system: str, args: argparse.Namespace, python: Path,
             harness: Path, work: Path) -> dict[str, Any]:
    """One cell for one system, in its own session, killed when it overruns."""
    out = work / "runs" / f"{cell['name']}-{system}"
    out.mkdir(parents=True, exist_ok=True)
    pg_root = work / "pg" / f"{cell['name']}-{system}"
    spec = {**cell, "system": system, "sample_every": args.sample_every}
    argv = [str(python), str(ROOT / "bench" / "pgjqb" / "native.py"), "--harness",
            str(harness), "--akadze-root", str(ROOT), "--akadze-python", args.akadze_python,
            "--oban-python", args.oban_python, "--pg-bin", args.pg_bin, "--pg-root",
            str(pg_root), "--out", str(out),
            "--cell", json.dumps(spec)]
    if args.plots:
        argv.append("--plots")
    replicas = int(cell.get("replicas", 1))
    # The harness gives each adapter 10 s to stop and each replica 60 s to start.
    budget = phase_seconds(cell) + 90 + 30 * replicas
    log = out / "harness.log"
    load_before = load_average()
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(harness)}
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    # A killed driver leaves its cluster behind: stop it.
    data = pg_root / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run([str(Path(args.pg_bin) / "pg_ctl"), "stop", "-m", "immediate", "-D",
                        str(data)], capture_output=True, check=False,
                       user="postgres" if os.geteuid() == 0 else None)
    shutil.rmtree(pg_root, ignore_errors=True)
    summaries = sorted(out.glob("*/summary.json"))
    summary = json.loads(summaries[-1].read_text()) if summaries else None
    error = None
    if rc != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if "Error" in line or "crash" in line or "exited" in line]
        error = lines[-1][:300] if lines else f"rc={rc}"
    return {"cell": cell["name"], "kind": cell["kind"], "system": system, "rc": rc,
            "error": error, "seconds": round(time.monotonic() - started, 1),
            "load_before": load_before, "load_after": load_average(),
            "rate": cell["rate"], "replicas": replicas,
            "workers": int(cell.get("workers", 32)), "mode": cell.get("mode", "fixed"),
            "phases": cell["phases"], "summary": summary, "log": str(log)}


def machine() -> str:
    """One line: host CPU, cores, memory, kernel, Postgres binaries."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, {mem} RAM, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    """Run the cells, print the table, write it to ``--results``."""
    parser = argparse.ArgumentParser(prog="python -m bench.pgjqb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", default=os.environ.get("PGJQB_HARNESS", DEFAULT_HARNESS),
                        help="the harness: bare git dir, checkout or clone URL "
                             "(default $PGJQB_HARNESS, else %(default)s)")
    parser.add_argument("--systems", default="akadze,procrastinate",
                        help="comma-separated: akadze, procrastinate, awa-python, "
                             "oban-python")
    parser.add_argument("--cells", default=",".join(DEFAULT_CELLS),
                        help="comma-separated cells (also: active_readers); default "
                             "%(default)s")
    parser.add_argument("--scale", type=float, default=0.3,
                        help="multiply every phase duration (1.0: about 13 min per system "
                             "for the default cells; the default: about 5 min per system "
                             "on a quiet 2-core machine, 7 on a busy one)")
    parser.add_argument("--cell-scale", action="append", default=[], metavar="CELL=X",
                        help="a cell's own scale, e.g. idle_in_tx=2.5 (repeatable)")
    parser.add_argument("--sample-every", type=int, default=2,
                        help="the adapters' sample cadence, seconds (harness default 5)")
    parser.add_argument("--venv", default=os.environ.get("PGJQB_VENV", "/tmp/pgjqb-venv"))
    parser.add_argument("--work", default=None, help="work dir (default /tmp/pgjqb-<time>)")
    parser.add_argument("--pg-bin", default=os.environ.get("PGJQB_PG_BIN",
                                                           "/usr/lib/postgresql/15/bin"))
    parser.add_argument("--akadze-python", default=sys.executable,
                        help="interpreter for the akadze adapter (default: this one)")
    parser.add_argument("--results", default=str(ROOT / "bench" / "pgjqb_results.md"))
    parser.add_argument("--no-results", action="store_true", help="print only")
    parser.add_argument("--plots", action="store_true", help="the harness's plots/report")
    args = parser.parse_args(argv)

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    wanted = [c.strip() for c in args.cells.split(",") if c.strip()]
    try:
        cell_scale = {k: float(v) for k, v in (i.split("=", 1) for i in args.cell_scale)}
    except ValueError:
        parser.error("--cell-scale takes CELL=NUMBER")
    table = {c["name"]: c for c in cells(args.scale, cell_scale)}
    unknown = [c for c in wanted if c not in table]
    if unknown:
        parser.error(f"unknown cells {unknown}; known: {', '.join(table)}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work = Path(args.work or f"/tmp/pgjqb-{stamp}")
    work.mkdir(parents=True, exist_ok=True)
    harness = get_harness(args.harness, work)
    if harness is None:
        return 2
    if not (Path(args.pg_bin) / "initdb").exists():
        print(f"pgjqb: no initdb in {args.pg_bin} (--pg-bin)", file=sys.stderr)
        return 2
    python = ensure_venv(Path(args.venv), "awa-python" in systems)
    args.oban_python = ""
    if "oban-python" in systems:
        try:
            args.oban_python = str(oban_side.oban_python(work / "oban-venv.log"))
        except oban_side.ObanUnavailable as exc:
            print(f"pgjqb: oban-python skipped: {exc}", file=sys.stderr, flush=True)
            systems = [s for s in systems if s != "oban-python"]
    total = sum(phase_seconds(table[c]) for c in wanted) * len(systems)
    print(f"pgjqb: harness {harness_revision(harness)[:12]} from {args.harness}; "
          f"{len(wanted)} cells x {len(systems)} systems, ~{total / 60:.0f} min of phases; "
          f"work dir {work}; load {load_average()}", file=sys.stderr, flush=True)
    results = []
    started = dt.datetime.now(dt.timezone.utc)
    for name in wanted:
        for system in systems:
            row = run_cell(table[name], system, args, python, harness, work)
            print(f"pgjqb: {name} / {system}: rc={row['rc']} in {row['seconds']} s, "
                  f"load {row['load_before']} -> {row['load_after']}",
                  file=sys.stderr, flush=True)
            results.append(row)
            (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    meta = {"machine": machine(), "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "harness": f"{harness_revision(harness)[:12]} ({args.harness})",
            "pg": args.pg_bin, "scale": args.scale, "cell_scale": cell_scale,
            "sample_every": args.sample_every,
            "systems": systems, "work": str(work),
            "command": "python -m bench.pgjqb " + " ".join(argv or sys.argv[1:])}
    text = render(results, meta)
    print(text)
    if not args.no_results:
        Path(args.results).write_text(text)
        print(f"pgjqb: table written to {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
