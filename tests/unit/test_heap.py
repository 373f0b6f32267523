"""``settle_heap``: a worker command's own process freezes its start-up objects, and the
library never does so in its caller's process. Each case runs in a fresh interpreter: the
collector's state is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_start_up_is_frozen_and_the_thresholds_kept() -> None:
    assert _run("""
        import gc
        gc.set_threshold(500, 5, 5)
        from akadze_core.execution.heap import settle_heap
        print(gc.get_freeze_count() > 0)
        settle_heap()
        print(gc.get_freeze_count() > 1000, *gc.get_threshold())
        """) == ["False", "True", "500", "5", "5"]


def test_the_library_leaves_its_callers_collector_alone() -> None:
    # Importing the worker and the facade (as an application embedding them does) changes
    # nothing: only the commands settle the heap of the process they own.
    assert _run("""
        import gc
        import akadze_core.worker.lifecycle, akadze_compat.bin.worker
        print(gc.get_freeze_count())
        """) == ["0"]


def test_the_celery_worker_command_settles_before_its_loop_starts() -> None:
    # _run_worker runs every pool's worker process (threads, solo, prefork's parent).
    assert _run("""
        import gc
        from akadze_compat.bin.worker import _run_worker
        class Probe:
            async def run(self):
                print(gc.get_freeze_count() > 1000)
                return 0
        raise SystemExit(_run_worker(Probe(), lambda signum: None))
        """) == ["True"]
