"""Observe the behaviour of ``celery`` or ``akadze_compat`` and print it as JSON.

Run as ``python celery_probe.py celery`` (with Celery's interpreter) or
``python celery_probe.py akadze_compat``; the differential tests run it both ways and
compare the two documents. It must run unchanged under both, so it imports only the
standard library and the package named on the command line, and every observation is
written in terms of public names. Identity-dependent things (ids, addresses in reprs)
are turned into stable values before they are recorded.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import inspect
import itertools
import json
import logging
import pickle
import sys
import traceback
import warnings
from collections.abc import Callable
from datetime import datetime
from types import ModuleType
from typing import Any

STATE_NAMES = [
    "PENDING", "RECEIVED", "STARTED", "SUCCESS", "FAILURE",
    "REVOKED", "REJECTED", "RETRY", "IGNORED",
]
STATE_SETS = [
    "READY_STATES", "UNREADY_STATES", "EXCEPTION_STATES", "PROPAGATE_STATES", "ALL_STATES",
]


def _parameters(function: Callable[..., Any]) -> list[list[Any]]:
    """Names, kinds and defaults of a signature (annotations left out: ours has them)."""
    return [
        [name, parameter.kind.name, repr(parameter.default)]
        for name, parameter in inspect.signature(function).parameters.items()
    ]


def _outcome(make: Callable[[], Any], describe: Callable[[Any], Any]) -> Any:
    """``describe(make())``, or the name of the exception ``make`` raised."""
    try:
        value = make()
    except Exception as exc:
        return {"raises": type(exc).__name__}
    return describe(value)


# --- states -----------------------------------------------------------------------------


def probe_states(package: str) -> dict[str, Any]:
    states = importlib.import_module(f"{package}.states")
    names = [*STATE_NAMES, "PROGRESS", "", "success"]
    comparisons = []
    for left, right in itertools.product([*STATE_NAMES, "PROGRESS"], repeat=2):
        wrapped_left, wrapped_right = states.state(left), states.state(right)
        comparisons.append([
            left, right,
            wrapped_left < right, wrapped_left <= right,
            wrapped_left > right, wrapped_left >= right,
            wrapped_left == right,
            left < wrapped_right, left > wrapped_right,  # plain str on the left
            wrapped_left < wrapped_right, wrapped_left > wrapped_right,
        ])
    return {
        "all": sorted(states.__all__),
        "constants": {name: getattr(states, name) for name in STATE_NAMES},
        "sets": {name: sorted(getattr(states, name)) for name in STATE_SETS},
        "set_types": {name: type(getattr(states, name)).__name__ for name in STATE_SETS},
        "PRECEDENCE": states.PRECEDENCE,
        "PRECEDENCE_LOOKUP": sorted(
            [repr(key), value] for key, value in states.PRECEDENCE_LOOKUP.items()
        ),
        "NONE_PRECEDENCE": states.NONE_PRECEDENCE,
        "precedence": {repr(name): states.precedence(name) for name in [*names, None]},
        "comparisons": comparisons,
        "sorted": sorted(map(states.state, [*STATE_NAMES, "PROGRESS"])),
        "state_is_str": isinstance(states.state("X"), str),
        "state_hash": hash(states.state("SUCCESS")) == hash("SUCCESS"),
    }


# --- exceptions -------------------------------------------------------------------------


def _retry_facts(retry: Any) -> dict[str, Any]:
    restored = pickle.loads(pickle.dumps(retry))
    return {
        "str": str(retry),
        "repr": repr(retry),
        "humanize": retry.humanize(),
        "message": retry.message,
        "exc": repr(retry.exc),
        "excs": retry.excs,
        "when": repr(retry.when),
        "is_eager": retry.is_eager,
        "sig": repr(retry.sig),
        "args_rest": repr(retry.args[1:]),
        "args_head_is_self": retry.args[0] is retry,
        "pickled": [restored.message, repr(restored.exc), repr(restored.when), str(restored)],
    }


def _plain_facts(error: BaseException) -> dict[str, Any]:
    return {"str": str(error), "repr": repr(error), "args": repr(error.args)}


def _reraise_keeps_identity(exceptions: ModuleType) -> list[Any]:
    try:
        raise ValueError("original")
    except ValueError as exc:
        original, traceback_of_original = exc, exc.__traceback__
    try:
        exceptions.reraise(ValueError, original, traceback_of_original)
    except ValueError as exc:
        return [exc is original, exc.__traceback__ is not None]
    return ["did not raise"]


def probe_exceptions(package: str) -> dict[str, Any]:
    exceptions = importlib.import_module(f"{package}.exceptions")
    classes = {
        name: [klass.__name__ for klass in value.__mro__]
        for name, value in vars(exceptions).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    when = datetime(2024, 1, 2, 3, 4, 5)
    retry_cases: dict[str, Callable[[], Any]] = {
        "empty": lambda: exceptions.Retry(),
        "message": lambda: exceptions.Retry("custom message"),
        "exc": lambda: exceptions.Retry(exc=ValueError("x")),
        "exc_no_message": lambda: exceptions.Retry(exc=ValueError()),
        "exc_string": lambda: exceptions.Retry(exc="described failure"),
        "when_int": lambda: exceptions.Retry(when=5),
        "when_float_exc": lambda: exceptions.Retry(when=3.5, exc=KeyError("k")),
        "when_datetime": lambda: exceptions.Retry(when=when),
        "positional": lambda: exceptions.Retry("m", ValueError(1), 3),
        "eager_sig": lambda: exceptions.Retry(when=1, is_eager=True, sig="signature"),
        "unknown_keyword": lambda: exceptions.Retry(foo=1),
    }
    error_cases: dict[str, Callable[[], Any]] = {
        "reject_default": lambda: exceptions.Reject(),
        "reject_requeue": lambda: exceptions.Reject("why", requeue=True),
        "reject_positional": lambda: exceptions.Reject("why", True),
        "not_registered": lambda: exceptions.NotRegistered("proj.tasks.add"),
        "queue_not_found": lambda: exceptions.QueueNotFound("missing"),
        "max_retries": lambda: exceptions.MaxRetriesExceededError(
            "gave up", task_args=[1, 2], task_kwargs={"a": 1}
        ),
        "max_retries_bare": lambda: exceptions.MaxRetriesExceededError(),
        "get_meta": lambda: exceptions.BackendGetMetaError("x", task_id="the-id"),
        "get_meta_bare": lambda: exceptions.BackendGetMetaError("x"),
        "store": lambda: exceptions.BackendStoreError("x", state="S", task_id="the-id"),
        "soft_time_limit": lambda: exceptions.SoftTimeLimitExceeded(3),
        "soft_time_limit_bare": lambda: exceptions.SoftTimeLimitExceeded(),
        "time_limit": lambda: exceptions.TimeLimitExceeded(1.5),
        "worker_lost": lambda: exceptions.WorkerLostError("lost"),
        "terminated": lambda: exceptions.Terminated(15),
        "timeout": lambda: exceptions.TimeoutError("slow"),
        "shutdown": lambda: exceptions.WorkerShutdown(1),
    }
    return {
        "all": sorted(exceptions.__all__),
        "classes": classes,
        "aliases": [
            exceptions.RetryTaskError is exceptions.Retry,
            exceptions.SystemTerminate is exceptions.WorkerTerminate,
            exceptions.TimeoutError is not TimeoutError,
        ],
        "signatures": {
            "Retry": _parameters(exceptions.Retry.__init__),
            "Reject": _parameters(exceptions.Reject.__init__),
            "CeleryCommandException": _parameters(exceptions.CeleryCommandException.__init__),
            "reraise": _parameters(exceptions.reraise),
        },
        "class_defaults": [
            exceptions.Retry.message, exceptions.Retry.exc, exceptions.Retry.when,
        ],
        "retry": {name: _outcome(make, _retry_facts) for name, make in retry_cases.items()},
        "errors": {name: _outcome(make, _plain_facts) for name, make in error_cases.items()},
        "reject_fields": _outcome(
            lambda: exceptions.Reject("why", requeue=True), lambda r: [r.reason, r.requeue]
        ),
        "max_retries_fields": [
            _outcome(
                lambda: exceptions.MaxRetriesExceededError(
                    "x", task_args=[1], task_kwargs={"a": 1}
                ),
                lambda error: [error.task_args, error.task_kwargs],
            ),
            _outcome(
                lambda: exceptions.MaxRetriesExceededError(),
                lambda error: [error.task_args, error.task_kwargs],
            ),
            _outcome(lambda: exceptions.MaxRetriesExceededError("x", task_name="t"), repr),
        ],
        "backend_fields": [
            exceptions.BackendGetMetaError("x", task_id="i").task_id,
            exceptions.BackendGetMetaError("x").task_id,
            [exceptions.BackendStoreError("x").state, exceptions.BackendStoreError("x").task_id],
        ],
        "shutdown_code": exceptions.WorkerShutdown(3).code,
        "command_exception": _outcome(
            lambda: exceptions.CeleryCommandException("bad usage", 2),
            lambda error: [error.exit_code, error.message, str(error)],
        ),
        "reraise": _reraise_keeps_identity(exceptions),
    }


# --- signals ----------------------------------------------------------------------------


class _Calls:
    """Receivers that record their own label when called, and the list they record into."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def receiver(self, label: str) -> Callable[..., Any]:
        def receiver(**kwargs: Any) -> str:
            self.labels.append(label)
            return label

        receiver.__qualname__ = receiver.__name__ = label
        return receiver

    def send(self, signal: Any, sender: Any, /, **named: Any) -> list[Any]:
        """Who was called, and the responses (receivers are unstable objects; left out)."""
        self.labels.clear()
        responses = signal.send(sender, **named)
        return [list(self.labels), [_stable(response) for _, response in responses]]


def _stable(value: Any) -> Any:
    return value if isinstance(value, (str, int, type(None))) else repr(value)


class _Listener:
    """Instances whose bound methods are connected as receivers."""

    def __init__(self, label: str, calls: _Calls) -> None:
        self.label, self.calls = label, calls

    def on_signal(self, **kwargs: Any) -> str:
        self.calls.labels.append(self.label)
        return self.label


def _scenario_connect_forms(Signal: type, calls: _Calls) -> dict[str, Any]:
    """The decorator forms, what they return, and how the sender filters."""
    signal = Signal(name="plain")
    seen: list[Any] = []

    @signal.connect
    def bare(signal: Any = None, sender: Any = None, **kwargs: Any) -> str:
        seen.append([signal.name, sender, sorted(kwargs.items())])
        return "bare"

    def with_sender(**kwargs: Any) -> str:
        return "with_sender"

    decorated = signal.connect(sender="proj.add")(with_sender)
    direct = signal.connect(calls.receiver("direct"))
    record: dict[str, Any] = {
        "returns": [bare.__name__, decorated is with_sender, direct.__name__],
        "matching": [[r.__name__, v] for r, v in signal.send("proj.add", x=1, y="two")],
        "receiver_saw": seen,
        "other": [r.__name__ for r, _ in signal.send("proj.other")],
        "none": [r.__name__ for r, _ in signal.send(None)],
        "equal_string": [r.__name__ for r, _ in signal.send("".join(["proj.", "add"]))],
    }
    positional = signal.connect("proj.positional")
    positional_receiver = positional(calls.receiver("positional"))  # held: weak by default
    record["positional_sender"] = positional_receiver.__name__
    record["positional_sender_send"] = calls.send(signal, "proj.positional")
    record["signal_keyword_clash"] = calls.send(signal, None, signal="clash")
    del positional_receiver
    record["needs_kwargs"] = _outcome(lambda: signal.connect(lambda sender: None), repr)
    try:
        signal.connect(lambda sender: None)
    except ValueError as exc:
        record["needs_kwargs_message"] = str(exc)
    return record


def _scenario_object_senders(Signal: type, calls: _Calls) -> dict[str, Any]:
    """Object senders match by identity, not equality."""

    class Sender:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    owner, lookalike = Sender(), Sender()
    signal = Signal(name="by_object")
    receiver = signal.connect(calls.receiver("object"), sender=owner)
    return {
        "sends": [calls.send(signal, owner), calls.send(signal, lookalike)],
        "has_listeners": [
            signal.has_listeners(), signal.has_listeners(owner),
            signal.has_listeners(lookalike), Signal(name="empty").has_listeners(),
        ],
        "empty_send": Signal(name="empty").send(None),
        "receiver_kept": receiver.__name__,
    }


def _scenario_duplicates(Signal: type, calls: _Calls) -> dict[str, Any]:
    """A repeated connection is ignored; dispatch_uid names a connection; disconnect."""
    signal = Signal(name="dedupe")
    once = calls.receiver("once")
    signal.connect(once)
    signal.connect(once)
    signal.connect(once, sender="only")
    signal.connect(calls.receiver("first_uid"), dispatch_uid="uid", weak=False)
    signal.connect(calls.receiver("second_uid"), dispatch_uid="uid", weak=False)
    record: dict[str, Any] = {
        "connected": [
            len(signal.receivers), calls.send(signal, None), calls.send(signal, "only"),
        ],
        "disconnect": [
            signal.disconnect(once, sender="only"),
            signal.disconnect(once, sender="only"),
            signal.disconnect(dispatch_uid="uid"),
            calls.send(signal, "only"),
            signal.disconnect(once),
            len(signal.receivers),
        ],
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        signal.disconnect(once, weak=True)
    record["disconnect_weak_warning"] = [
        [[k.__name__ for k in w.category.__mro__], str(w.message)] for w in caught
    ]
    return record


def _scenario_weak_references(Signal: type, calls: _Calls) -> dict[str, Any]:
    """Weakly held functions and bound methods go away with their referents."""
    signal = Signal(name="weak")
    kept_function = calls.receiver("kept")
    signal.connect(kept_function)
    signal.connect(calls.receiver("collected"))
    signal.connect(calls.receiver("strong"), weak=False)
    listener, doomed = _Listener("live_method", calls), _Listener("dead_method", calls)
    second = _Listener("second_instance", calls)
    signal.connect(listener.on_signal)
    signal.connect(doomed.on_signal)
    signal.connect(second.on_signal)
    del doomed
    gc.collect()
    record: dict[str, Any] = {"after_gc": [calls.send(signal, None), len(signal.receivers)]}
    signal.connect(calls.receiver("after_gc"), weak=False)
    record["count_after_connect"] = len(signal.receivers)
    record["bound_method_disconnect"] = [
        signal.disconnect(listener.on_signal), calls.send(signal, None),
    ]
    record["kept"] = [kept_function.__name__, second.label]
    return record


def _scenario_failing_receivers(Signal: type, calls: _Calls) -> dict[str, Any]:
    """A failing receiver is logged and does not stop the others; BaseException escapes."""
    signal = Signal(name="robust")

    def fails(**kwargs: Any) -> None:
        calls.labels.append("fails")
        raise ValueError("receiver broke")

    before, after = calls.receiver("before"), calls.receiver("after")
    signal.connect(before)
    signal.connect(fails)
    signal.connect(after)
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        sent = calls.send(signal, "s")
    finally:
        logging.getLogger().removeHandler(handler)

    class Fatal(BaseException):
        pass

    def fatal(**kwargs: Any) -> None:
        raise Fatal()

    fatal_signal = Signal(name="fatal")
    fatal_signal.connect(fatal)
    try:
        fatal_signal.send(None)
        escaped = False
    except Fatal:
        escaped = True
    return {
        "sent": sent,
        "logged": [
            [r.name, r.levelname, r.msg, r.exc_info[0].__name__ if r.exc_info else None]
            for r in logged
        ],
        "send_robust_is_send": Signal.send_robust is Signal.send,
        "base_exception_escapes": escaped,
    }


def _signal_scenario(signals: ModuleType) -> dict[str, Any]:
    """Connect, send and disconnect the way projects do, recording what receivers see."""
    Signal, calls = signals.Signal, _Calls()
    shown = Signal(name="shown", providing_args=["only_arg"])
    return {
        "connect_forms": _scenario_connect_forms(Signal, calls),
        "object_senders": _scenario_object_senders(Signal, calls),
        "duplicates": _scenario_duplicates(Signal, calls),
        "weak_references": _scenario_weak_references(Signal, calls),
        "failing_receivers": _scenario_failing_receivers(Signal, calls),
        "repr": [repr(shown), str(shown), shown.name, sorted(shown.providing_args)],
        "defaults": [Signal().name, sorted(Signal().providing_args), Signal().use_caching],
    }


def probe_signals(package: str) -> dict[str, Any]:
    signals = importlib.import_module(f"{package}.signals")
    Signal = signals.Signal
    defined = {
        attribute: [value.name, sorted(value.providing_args)]
        for attribute, value in vars(signals).items()
        if isinstance(value, Signal)
    }
    return {
        "all": sorted(signals.__all__),
        "defined": defined,
        "signatures": {
            "__init__": _parameters(Signal.__init__),
            "disconnect": _parameters(Signal.disconnect),
            "send": _parameters(Signal.send),
            "has_listeners": _parameters(Signal.has_listeners),
        },
        "scenario": _signal_scenario(signals),
    }


# --- utils.log --------------------------------------------------------------------------


def _chain(logger: logging.Logger) -> list[str]:
    names = []
    current: logging.Logger | None = logger
    while current is not None:
        names.append(current.name)
        current = current.parent
    return names


def _logger_facts(logger: logging.Logger) -> dict[str, Any]:
    return {
        "name": logger.name,
        "chain": _chain(logger),
        "handlers": [type(handler).__name__ for handler in logger.handlers],
        "propagate": logger.propagate,
        "level": logger.level,
    }


def probe_log(package: str) -> dict[str, Any]:
    log = importlib.import_module(f"{package}.utils.log")
    record: dict[str, Any] = {
        "base_logger": _logger_facts(log.base_logger),
        "task_logger": _logger_facts(log.task_logger),
        "worker_logger": _logger_facts(log.worker_logger),
        "task_module": _logger_facts(log.get_task_logger("proj.tasks")),
        "task_module_again": log.get_task_logger("proj.tasks") is log.get_task_logger(
            "proj.tasks"
        ),
        "task_top_level": _logger_facts(log.get_task_logger("tasks")),
        "task_under_celery": _logger_facts(log.get_task_logger("celery.app.custom")),
        "plain_top_level": _logger_facts(log.get_logger("standalone")),
        "plain_dotted_orphan": _logger_facts(log.get_logger("orphan.child")),
        "plain_under_celery": _logger_facts(log.get_logger("celery.worker.custom")),
        "by_logger_object": _logger_facts(log.get_logger(logging.getLogger("given.object"))),
    }
    logging.getLogger("existing")
    record["plain_dotted_with_parent"] = _logger_facts(log.get_logger("existing.child"))
    record["task_dotted_with_parent"] = _logger_facts(log.get_task_logger("existing.tasks"))
    record["reserved"] = {
        name: _outcome(lambda name=name: log.get_task_logger(name), repr)
        for name in ["celery", "celery.task", "celery.task.sub"]
    }
    with contextlib.suppress(RuntimeError):
        log.get_task_logger("celery")
    try:
        log.get_task_logger("celery.task")
    except RuntimeError as exc:
        record["reserved_message"] = str(exc)
    record["mlevel"] = {
        repr(level): _outcome(lambda level=level: log.mlevel(level), repr)
        for level in ["info", "DEBUG", "warn", "Warning", "fatal", 10, 0, None, "", "bogus"]
    }
    record["LOG_LEVELS"] = sorted([repr(key), repr(value)] for key, value in log.LOG_LEVELS.items())

    # Configuration on "celery.task" and "celery" governs task loggers.
    captured: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]
    logging.getLogger("celery").addHandler(handler)
    logging.getLogger("celery.task").setLevel(logging.ERROR)
    task_module_logger = log.get_task_logger("proj.levels")
    task_module_logger.warning("dropped by celery.task's level")
    task_module_logger.error("kept")
    record["effective"] = [
        task_module_logger.getEffectiveLevel(), [r.getMessage() for r in captured],
    ]
    return record


PROBES = {
    "states": probe_states,
    "exceptions": probe_exceptions,
    "signals": probe_signals,
    "log": probe_log,
}


def main(argv: list[str]) -> int:
    package = argv[1]
    output: dict[str, Any] = {}
    for section, probe in PROBES.items():
        try:
            output[section] = probe(package)
        except Exception:
            # One broken section must not hide what the others observed.
            output[section] = {"probe_error": traceback.format_exc()}
    json.dump(output, sys.stdout, sort_keys=True, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
