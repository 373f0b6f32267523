"""Run one cell of the pgjqb harness for one system, natively: no Docker.

Started by ``python -m bench.pgjqb`` under the harness's own virtualenv (it imports the
harness's ``bench_harness`` package from ``--harness``). It drives the harness's own
orchestrator (``bench_harness.orchestrator.drive``: phases, hooks, metrics daemon, wait
events, summary.json) and replaces only what the orchestrator does with Docker:

- Postgres: ``docker compose up/down/stop/start`` become a private Postgres cluster
  (``initdb``/``pg_ctl`` from ``--pg-bin``) on a free port of 127.0.0.1, configured by the
  harness's own ``postgres.conf``; fresh (initdb) for every system as the harness's default
  non-``--fast`` mode does, stopped and started on the same data directory for the
  ``postgres-restart`` chaos phase.
- Adapters: ``docker build`` / ``docker run`` become a plain subprocess: the harness's
  Procrastinate adapter under this interpreter, our akadze adapter under ``--akadze-python``,
  the Oban for Python adapter under ``--oban-python`` (Oban needs Python >= 3.12).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Where this machine's Postgres 15 server binaries are (Debian's layout).
DEFAULT_PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NativePostgres:
    """A private cluster: ``fresh()`` = initdb + start, ``stop()``/``start()`` keep the data.

    ``conf``: a postgres.conf included after the stock one (the harness's); None keeps the
    server's stock settings (bench.hotpath). Either way only where it listens is changed.
    """

    USER = "bench"

    def __init__(self, bin_dir: Path, root: Path, port: int, conf: Path | None) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.port = port
        self.conf = conf
        self.data = root / "data"
        self.log = root / "postgres.log"
        # Postgres refuses to run as root: as root, the cluster is the postgres user's.
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        print(f"[native-pg] $ {' '.join(argv)}", file=sys.stderr, flush=True)
        done = subprocess.run(argv, check=False, text=True, capture_output=True,
                              user=self.user, cwd=self.root if self.root.exists() else None)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")
        return done

    def running(self) -> bool:
        """True when the cluster's postmaster answers pg_ctl status."""
        if not (self.data / "postmaster.pid").exists():
            return False
        return self._run(str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data),
                         check=False).returncode == 0

    def fresh(self) -> None:
        """A new cluster: the old data directory (if any) goes, initdb, ``conf`` (if any),
        start."""
        self.destroy()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(self.root, self.user)
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.USER,
                  "--auth=trust", "-E", "UTF8", "--no-sync")
        sock_dir = self.root / "sock"
        sock_dir.mkdir(exist_ok=True)
        if self.user:
            shutil.chown(sock_dir, self.user)
        with (self.data / "postgresql.conf").open("a") as fh:
            if self.conf is not None:
                fh.write(f"\n# pgjqb native driver: the harness's own settings\n"
                         f"include '{self.conf}'\n")
            fh.write(f"\n# Only where this cluster listens (never beyond loopback)\n"
                     f"listen_addresses = '127.0.0.1'\n"
                     f"port = {self.port}\n"
                     f"unix_socket_directories = '{sock_dir}'\n")
        self.start()

    def start(self) -> None:
        """Start on the existing data directory and wait until it answers a query."""
        self._run(str(self.bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D",
                  str(self.data), "-l", str(self.log))
        import psycopg

        deadline = time.time() + 30
        while True:
            try:
                with psycopg.connect(self.url(), autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def url(self, dbname: str = "postgres") -> str:
        """A URL of ``dbname`` as the cluster's superuser (trust: no password)."""
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        """Fast shutdown (clients disconnected), data kept: the chaos phase's outage."""
        if self.running():
            self._run(str(self.bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D",
                      str(self.data), check=False)

    def destroy(self) -> None:
        """Stop (immediate) and remove the data directory."""
        if self.running():
            self._run(str(self.bin_dir / "pg_ctl"), "stop", "-m", "immediate", "-w", "-D",
                      str(self.data), check=False)
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def private_cluster(pg_bin: Path, prefix: str,
                    settings: str | None = None) -> Iterator[NativePostgres]:
    """A fresh cluster in a temp dir (``prefix``) on a free port: stock settings, plus
    ``settings`` (postgresql.conf lines) when given; stopped and deleted on the way out."""
    parent = Path(tempfile.mkdtemp(prefix=prefix))
    parent.chmod(0o755)  # as root the server runs as ``postgres``, which must reach its dir
    conf = None
    if settings is not None:
        conf = parent / "settings.conf"
        conf.write_text(settings)
        conf.chmod(0o644)
    server = NativePostgres(pg_bin, parent / "pg", free_port(), conf)
    try:
        server.fresh()
        yield server
    finally:
        server.destroy()
        shutil.rmtree(parent, ignore_errors=True)


def install(args: argparse.Namespace, pg: NativePostgres) -> Any:
    """Point the harness at the native cluster and the native adapters; return the
    orchestrator module."""
    from bench_harness import adapters as adapters_mod
    from bench_harness import orchestrator as orch

    adapters_mod.PG_PORT = pg.port
    orch.start_postgres = lambda _image: pg.fresh()
    orch.stop_postgres = lambda _image: pg.destroy()
    orch._compose_stop_postgres = lambda _image: pg.stop()
    orch._compose_start_postgres = lambda _image: pg.start()
    orch.RESULTS_ROOT = Path(args.out)
    if not args.plots:
        # matplotlib on 2 busy cores costs more than the cell; summary.json is the output.
        orch.render_all = lambda *a, **k: None
        orch.write_interactive_report = lambda *a, **k: None

    def no_build(_skip: bool) -> None:
        return None

    def launch_procrastinate(manifest: Any, overrides: dict[str, str]) -> Any:
        return adapters_mod.LaunchSpec(
            argv=[sys.executable, str(Path(args.harness) / "procrastinate-bench" / "main.py")],
            env=adapters_mod._base_env(manifest, overrides))

    def launch_akadze(manifest: Any, overrides: dict[str, str]) -> Any:
        env = adapters_mod._base_env(manifest, overrides)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.akadze_root, os.environ.get("AKADZE_PYTHONPATH", "")) if p)
        return adapters_mod.LaunchSpec(
            argv=[args.akadze_python, str(Path(args.akadze_root) / "bench" / "pgjqb"
                                          / "akadze_adapter" / "main.py")],
            env=env)

    def launch_awa(manifest: Any, overrides: dict[str, str]) -> Any:
        return adapters_mod.LaunchSpec(
            argv=[sys.executable, str(Path(args.akadze_root) / "bench" / "pgjqb"
                                      / "awa_adapter" / "main.py")],
            env=adapters_mod._base_env(manifest, overrides))

    def launch_oban_python(manifest: Any, overrides: dict[str, str]) -> Any:
        if not args.oban_python:
            raise RuntimeError("oban-python needs --oban-python (Oban's virtualenv)")
        return adapters_mod.LaunchSpec(
            argv=[args.oban_python, str(Path(args.akadze_root) / "bench" / "pgjqb"
                                        / "oban_adapter" / "main.py")],
            env=adapters_mod._base_env(manifest, overrides))

    here = Path(args.akadze_root) / "bench" / "pgjqb"
    adapters_mod.ADAPTERS["procrastinate"] = adapters_mod.AdapterEntry(
        bench_dir=Path(args.harness) / "procrastinate-bench", builder=no_build,
        launcher=launch_procrastinate)
    adapters_mod.ADAPTERS["akadze"] = adapters_mod.AdapterEntry(
        bench_dir=here / "akadze_adapter", builder=no_build, launcher=launch_akadze)
    adapters_mod.ADAPTERS["awa-python"] = adapters_mod.AdapterEntry(
        bench_dir=here / "awa_adapter", builder=no_build, launcher=launch_awa)
    adapters_mod.ADAPTERS["oban-python"] = adapters_mod.AdapterEntry(
        bench_dir=here / "oban_adapter", builder=no_build, launcher=launch_oban_python)
    return orch


def main() -> int:
    """One cell, one system; writes the harness's run directory under ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--harness", required=True)
    parser.add_argument("--akadze-root", required=True)
    parser.add_argument("--akadze-python", required=True)
    parser.add_argument("--oban-python", default="",
                        help="the interpreter of Oban's virtualenv (for oban-python)")
    parser.add_argument("--pg-bin", required=True)
    parser.add_argument("--pg-root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cell", required=True, help="JSON: system, phases, settings")
    parser.add_argument("--plots", action="store_true")
    args = parser.parse_args()
    cell = json.loads(args.cell)
    sys.path.insert(0, args.harness)
    # Every adapter paces itself on real elapsed time and reads the control file, so the
    # harness's high-load phases raise the offered rate for all of them alike (the
    # harness's stdin pacer has a fixed rate, and the Procrastinate adapter ignores it).
    os.environ["PRODUCER_PACING"] = cell.get("pacing", "adapter")
    for key, value in cell.get("env", {}).items():
        os.environ[key] = str(value)
    pg = NativePostgres(Path(args.pg_bin), Path(args.pg_root), free_port(),
                        Path(args.harness) / "postgres.conf")
    orch = install(args, pg)
    from bench_harness.phases import resolve_scenario

    phases = resolve_scenario(None, cell["phases"])
    try:
        run_dir = orch.drive(
            systems=[cell["system"]], scenario=cell["name"], phases=phases,
            pg_image=f"native:{args.pg_bin}", fast=False, skip_build=True,
            sample_every_s=int(cell.get("sample_every", 5)),
            producer_rate=int(cell["rate"]), producer_mode=cell.get("mode", "fixed"),
            target_depth=int(cell.get("target_depth", 1000)),
            worker_count=int(cell.get("workers", 32)),
            high_load_multiplier=float(cell.get("high_load_multiplier", 1.5)),
            awa_completion_batch_size=None, replicas=int(cell.get("replicas", 1)),
            cli_args=sys.argv, wait_events_enabled=True, wait_event_sample_every_s=1.0)
    finally:
        pg.destroy()
    print(f"[native] run_dir={run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
