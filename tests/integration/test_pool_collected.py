"""A sync pool whose app was dropped unclosed is closed by us, not by psycopg_pool's
``__del__`` (which fails when the collection runs on one of the pool's own threads)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import psycopg_pool

from akadze_core import App


def _wait_closed(pool: psycopg_pool.ConnectionPool, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not pool.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return pool.closed


def _used_pool(app: App) -> psycopg_pool.ConnectionPool:
    pool = app.connections.pool()
    with pool.connection() as connection:
        connection.execute("SELECT 1")
    return pool


def test_dropped_app_closes_its_pool(database_url: str) -> None:
    app = App(database_url=database_url)
    pool = _used_pool(app)
    assert not pool.closed
    del app
    gc.collect()
    assert _wait_closed(pool)


def test_collected_on_another_thread(database_url: str) -> None:
    """Collected on a thread other than the main one: closed from a thread of its own."""
    holder = [App(database_url=database_url)]
    pool = _used_pool(holder[0])

    def drop() -> None:
        holder.clear()
        gc.collect()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    assert _wait_closed(pool)


def test_closed_pool_left_alone_and_exit_is_quiet(database_url: str) -> None:
    """An app still alive at exit: its pool is closed at exit, with nothing on stderr; in a
    forked child that exits, the parent's pool is not touched."""
    script = textwrap.dedent(f"""
        import os
        from akadze_core import App
        app = App(database_url={database_url!r})
        pool = app.connections.pool()
        with pool.connection() as connection:
            connection.execute("SELECT 1")
        pid = os.fork()
        if pid == 0:
            raise SystemExit(0)  # a normal exit: atexit and finalizers run
        os.waitpid(pid, 0)
        with pool.connection() as connection:  # the child's exit left the session alone
            assert connection.execute("SELECT 1").fetchone() == (1,)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr
