"""Celery's integration-test helpers (``celery.contrib.testing.manager``): ``Manager(app)``.

Celery's own integration suites (and projects that copied them) build one ``Manager`` over
the session app and use it to wait for results (``join``), for tasks to reach a worker
(``assert_accepted``/``assert_received``, through ``inspect().query_task``), for a condition
(``wait_for``) or its absence (``ensure_not_for_a_while``), and for the queues to drain
(``wait_until_idle``). Here the workers answer through the database; a lost connection is
``psycopg.OperationalError`` (the ``connerrors`` a join rides out).
"""

from __future__ import annotations

import builtins
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import count
from typing import Any, TextIO

import psycopg

from ... import states
from ...exceptions import TimeoutError
from ...result import ResultSet
from ...utils.time import humanize_seconds

__all__ = ["E_STILL_WAITING", "Manager", "ManagerMixin", "Sentinel", "retry_over_time"]

E_STILL_WAITING = "Still waiting for {0}.  Trying again {when}: {exc!r}"


class Sentinel(Exception):
    """Signifies the end of something."""


def _intervals(start: float, step: float, maximum: float) -> Iterator[float]:
    interval = start
    while True:
        yield min(interval, maximum)
        interval += step


def retry_over_time(fun: Callable[..., Any], catch: Any, args: Sequence[Any] = (),
                    kwargs: dict[str, Any] | None = None,
                    errback: Callable[..., Any] | None = None, max_retries: int | None = None,
                    interval_start: float = 2, interval_step: float = 2,
                    interval_max: float = 30, callback: Callable[[], Any] | None = None,
                    timeout: float | None = None) -> Any:
    """Call ``fun`` until it does not raise ``catch`` (kombu's helper of that name): at most
    ``max_retries`` retries (None: forever) and ``timeout`` seconds, sleeping the interval
    ``errback(exc, intervals, retries)`` returns (else the next of ``interval_start``,
    ``+interval_step``..., at most ``interval_max``) between calls; the last error is
    raised."""
    kwargs = kwargs or {}
    intervals = _intervals(interval_start, interval_step, interval_max)
    deadline = None if timeout is None else time.monotonic() + timeout
    for retries in count():
        try:
            return fun(*args, **kwargs)
        except catch as exc:
            if max_retries is not None and retries >= max_retries:
                raise
            if deadline is not None and time.monotonic() > deadline:
                raise
            if callback is not None:
                callback()
            wait = errback(exc, intervals, retries) if errback is not None else next(intervals)
            if wait:
                time.sleep(float(wait))
    raise AssertionError("unreachable")  # count() never ends


class ManagerMixin:
    """What ``Manager`` adds to an object with an ``app``."""

    app: Any

    def _init_manager(self, block_timeout: float = 30 * 60.0, no_join: bool = False,
                      stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.stdout = sys.stdout if stdout is None else stdout
        self.stderr = sys.stderr if stderr is None else stderr
        #: The errors of a lost database connection: a join reports them and goes on.
        self.connerrors: tuple[type[BaseException], ...] = (psycopg.OperationalError,)
        self.block_timeout = block_timeout
        self.no_join = no_join

    def remark(self, s: str, sep: str = "-") -> None:
        """Print ``s`` to ``stdout``, after ``sep``."""
        print(f"{sep}{s}", file=self.stdout)

    def warn(self, s: str) -> None:
        """Write ``s`` to ``stderr``."""
        self.stderr.write(s + "\n")

    def missing_results(self, r: Sequence[Any]) -> list[str]:
        """The ids of the results in ``r`` not ready yet."""
        return [res.id for res in r if not res.ready()]

    def wait_for(self, fun: Callable[..., Any], catch: Any, desc: str = "thing",
                 args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                 errback: Callable[..., Any] | None = None, max_retries: int = 10,
                 interval_start: float = 0.1, interval_step: float = 0.5,
                 interval_max: float = 5.0, emit_warning: bool = False,
                 **options: Any) -> Any:
        """Call ``fun`` until it stops raising ``catch`` (the thing has not happened yet)."""

        def on_error(exc: BaseException, intervals: Iterator[float], retries: int) -> float:
            interval = next(intervals)
            if emit_warning:
                self.warn(E_STILL_WAITING.format(
                    desc, when=humanize_seconds(interval, "in", " "), exc=exc))
            if errback is not None:
                errback(exc, interval, retries)
            return interval

        return self.retry_over_time(
            fun, catch, args=args, kwargs=kwargs or {}, errback=on_error,
            max_retries=max_retries, interval_start=interval_start,
            interval_step=interval_step, interval_max=interval_max, **options)

    def ensure_not_for_a_while(self, fun: Callable[..., Any], catch: Any,
                               desc: str = "thing", max_retries: int = 20,
                               interval_start: float = 0.1, interval_step: float = 0.02,
                               interval_max: float = 1.0, emit_warning: bool = False,
                               **options: Any) -> None:
        """Make sure ``fun`` keeps raising ``catch`` (the thing does not happen) for a
        while; AssertionError when it stops."""
        try:
            self.wait_for(fun, catch, desc=desc, max_retries=max_retries,
                          interval_start=interval_start, interval_step=interval_step,
                          interval_max=interval_max, emit_warning=emit_warning)
        except catch:
            return
        raise AssertionError(f"Should not have happened: {desc}")

    def retry_over_time(self, *args: Any, **kwargs: Any) -> Any:
        """``retry_over_time`` (a method, so a subclass can change it)."""
        return retry_over_time(*args, **kwargs)

    def join(self, r: Any, propagate: bool = False, max_retries: int = 10,
             **kwargs: Any) -> Any:
        """The results of ``r`` (a result or a ``ResultSet``), asked again up to
        ``max_retries`` times while they time out; AssertionError when they never come."""
        if self.no_join:
            return None
        if not isinstance(r, ResultSet):
            r = ResultSet([r], app=self.app)
        received: list[str] = []

        def on_result(task_id: str, value: Any) -> None:
            received.append(task_id)

        for _ in range(max_retries) if max_retries else count(0):
            received[:] = []
            try:
                return r.get(callback=on_result, propagate=propagate, **kwargs)
            except (builtins.TimeoutError, TimeoutError) as exc:  # socket.timeout is the first
                waiting_for = ", ".join(self.missing_results(r))
                if len(waiting_for) > 256:
                    waiting_for = waiting_for[:253] + "..."
                self.remark(f"Still waiting for {len(r) - len(received)}/{len(r)}: "
                            f"[{waiting_for}]: {exc!r}", "!")
            except self.connerrors as exc:
                self.remark(f"join: connection lost: {exc!r}", "!")
        raise AssertionError("Test failed: Missing task results")

    def inspect(self, timeout: float = 3.0) -> Any:
        """``app.control.inspect(timeout=timeout)``."""
        return self.app.control.inspect(timeout=timeout)

    def query_tasks(self, ids: Sequence[str], timeout: float = 0.5) -> Iterator[tuple[str, Any]]:
        """``(hostname, {task id: [state, info]})`` for each worker holding some of ``ids``."""
        tasks = self.inspect(timeout).query_task(*ids) or {}
        yield from tasks.items()

    def query_task_states(self, ids: Sequence[str], timeout: float = 0.5) \
            -> defaultdict[str, set[str]]:
        """The ids of ``ids`` by the state the workers report (active, reserved)."""
        found: defaultdict[str, set[str]] = defaultdict(set)
        for _hostname, reply in self.query_tasks(ids, timeout=timeout):
            for task_id, (state, _) in reply.items():
                found[state].add(task_id)
        return found

    def assert_accepted(self, ids: Sequence[str], interval: float = 0.5,
                        desc: str = "waiting for tasks to be accepted", **policy: Any) -> Any:
        """Wait until every task of ``ids`` runs on a worker."""
        return self.assert_task_worker_state(self.is_accepted, ids, interval=interval,
                                             desc=desc, **policy)

    def assert_received(self, ids: Sequence[str], interval: float = 0.5,
                        desc: str = "waiting for tasks to be received", **policy: Any) -> Any:
        """Wait until every task of ``ids`` is held by a worker (claimed or running)."""
        return self.assert_task_worker_state(self.is_received, ids, interval=interval,
                                             desc=desc, **policy)

    def assert_result_tasks_in_progress_or_completed(
            self, async_results: Sequence[Any], interval: float = 0.5,
            desc: str = "waiting for tasks to be started or completed", **policy: Any) -> Any:
        """Wait until every result is STARTED or SUCCESS."""
        return self.assert_task_state_from_result(self.is_result_task_in_progress,
                                                  async_results, interval=interval,
                                                  desc=desc, **policy)

    def assert_task_state_from_result(self, fun: Callable[..., Any], results: Sequence[Any],
                                      interval: float = 0.5, **policy: Any) -> Any:
        """Wait until ``fun(results)`` is true."""
        return self.wait_for(partial(self.true_or_raise, fun, results, timeout=interval),
                             (Sentinel,), **policy)

    @staticmethod
    def is_result_task_in_progress(results: Sequence[Any], **kwargs: Any) -> bool:
        """Whether every result is STARTED or SUCCESS."""
        return all(result.state in (states.STARTED, states.SUCCESS) for result in results)

    def assert_task_worker_state(self, fun: Callable[..., Any], ids: Sequence[str],
                                 interval: float = 0.5, **policy: Any) -> Any:
        """Wait until ``fun(ids)`` is true."""
        return self.wait_for(partial(self.true_or_raise, fun, ids, timeout=interval),
                             (Sentinel,), **policy)

    def is_received(self, ids: Sequence[str], **kwargs: Any) -> bool:
        """Whether every task of ``ids`` is reserved, active or ready on a worker."""
        return self._ids_matches_state(["reserved", "active", "ready"], ids, **kwargs)

    def is_accepted(self, ids: Sequence[str], **kwargs: Any) -> bool:
        """Whether every task of ``ids`` is active or ready on a worker."""
        return self._ids_matches_state(["active", "ready"], ids, **kwargs)

    def _ids_matches_state(self, expected_states: Sequence[str], ids: Sequence[str],
                           timeout: float = 0.5) -> bool:
        found = self.query_task_states(ids, timeout=timeout)
        return all(any(task_id in found[state] for state in expected_states)
                   for task_id in ids)

    def true_or_raise(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fun(...)``, or ``Sentinel`` raised when it is false."""
        result = fun(*args, **kwargs)
        if not result:
            raise Sentinel()
        return result

    def wait_until_idle(self) -> None:
        """Purge the waiting tasks, then wait until no worker runs one."""
        control = self.app.control
        while control.purge():
            pass
        inspect = control.inspect()
        while True:
            active = inspect.active() or {}
            if sum(len(tasks or ()) for tasks in active.values()) == 0:
                return
            time.sleep(0.1)


class Manager(ManagerMixin):
    """Test helpers for task integration tests."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.app = app
        self._init_manager(**kwargs)
