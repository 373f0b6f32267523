"""akadze_compat.signals: Celery's Signal API and signal names."""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest

from akadze_compat import signals
from akadze_compat.exceptions import CDeprecationWarning
from akadze_compat.signals import Signal
from tests.compat.differential import observed

CELERY_SIGNALS = [
    "before_task_publish", "after_task_publish", "task_received", "task_prerun", "task_postrun",
    "task_success", "task_retry", "task_failure", "task_internal_error", "task_revoked",
    "task_rejected", "task_unknown", "task_sent", "celeryd_init", "celeryd_after_setup",
    "import_modules", "worker_init", "worker_before_create_process", "worker_process_init",
    "worker_process_shutdown", "worker_ready", "worker_shutdown", "worker_shutting_down",
    "heartbeat_sent", "setup_logging", "after_setup_logger", "after_setup_task_logger",
    "beat_init", "beat_embedded_init", "eventlet_pool_started", "eventlet_pool_preshutdown",
    "eventlet_pool_postshutdown", "eventlet_pool_apply", "user_preload_options",
]


class Recorder:
    """A receiver (kept alive by the test) that records every call."""

    def __init__(self, result: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = result

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.result


@pytest.mark.parametrize("name", CELERY_SIGNALS)
def test_every_celery_signal_is_defined(name: str) -> None:
    signal = getattr(signals, name)
    assert isinstance(signal, Signal)
    assert signal.name == name


def test_exported_names_are_signals() -> None:
    assert all(isinstance(getattr(signals, name), Signal) for name in signals.__all__)


class TestConnect:
    def test_decorator_without_arguments(self) -> None:
        signal = Signal(name="s")

        @signal.connect
        def receiver(**kwargs: Any) -> str:
            return "called"

        assert receiver.__name__ == "receiver"  # the decorator returns the function itself
        assert signal.send(None) == [(receiver, "called")]

    def test_decorator_with_a_sender(self) -> None:
        signal = Signal(name="s")

        @signal.connect(sender="proj.add")
        def receiver(**kwargs: Any) -> str:
            return "called"

        assert signal.send("proj.add") == [(receiver, "called")]
        assert signal.send("proj.mul") == []

    def test_plain_call_and_keyword_receiver(self) -> None:
        signal, first, second = Signal(name="s"), Recorder(1), Recorder(2)
        assert signal.connect(first) is first
        assert signal.connect(receiver=second) is second
        assert [response for _, response in signal.send(None)] == [1, 2]

    def test_positional_non_callable_is_the_sender(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect("proj.add")(receiver)
        signal.send("proj.mul")
        signal.send("proj.add")
        assert len(receiver.calls) == 1

    def test_receiver_must_accept_keywords(self) -> None:
        def positional_only(sender: Any) -> None:
            return None

        with pytest.raises(ValueError, match="must accept keyword arguments"):
            Signal(name="s").connect(positional_only)

    def test_same_connection_twice_counts_once(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect(receiver)
        signal.connect(receiver)
        signal.send(None)
        assert len(receiver.calls) == 1

    def test_dispatch_uid_identifies_the_connection(self) -> None:
        signal, first, second = Signal(name="s"), Recorder("first"), Recorder("second")
        signal.connect(first, dispatch_uid="audit")
        signal.connect(second, dispatch_uid="audit")
        assert [response for _, response in signal.send(None)] == ["first"]


class TestSend:
    def test_receivers_get_signal_sender_and_keywords(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect(receiver)
        signal.send("the-sender", task_id="abc", retval=3)
        assert receiver.calls == [
            {"signal": signal, "sender": "the-sender", "task_id": "abc", "retval": 3}
        ]

    def test_string_senders_match_by_value(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect(receiver, sender="proj.tasks.add")
        signal.send("".join(["proj.tasks.", "add"]))  # equal, not identical
        assert len(receiver.calls) == 1

    def test_object_senders_match_by_identity(self) -> None:
        class Task:
            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = object.__hash__

        signal, receiver, task = Signal(name="s"), Recorder(), Task()
        signal.connect(receiver, sender=task)
        signal.send(Task())
        assert receiver.calls == []
        signal.send(task)
        assert len(receiver.calls) == 1

    def test_a_proxy_sender_stands_for_its_target(self) -> None:
        class Proxy:
            def __init__(self, target: object) -> None:
                self.target = target

            def _get_current_object(self) -> object:
                return self.target

        signal, receiver, task = Signal(name="s"), Recorder(), object()
        signal.connect(receiver, sender=Proxy(task))
        signal.send(task)
        assert len(receiver.calls) == 1

    def test_failing_receiver_is_logged_and_the_others_still_run(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        signal, before, after = Signal(name="s"), Recorder("before"), Recorder("after")

        def broken(**kwargs: Any) -> None:
            raise ValueError("receiver broke")

        signal.connect(before)
        signal.connect(broken)
        signal.connect(after)
        with caplog.at_level(logging.ERROR, logger="celery.utils.dispatch.signal"):
            responses = signal.send(None)
        assert [r for r, _ in responses] == [before, broken, after]
        assert isinstance(responses[1][1], ValueError)
        [record] = caplog.records
        assert record.name == "celery.utils.dispatch.signal"
        assert record.exc_info is not None

    def test_base_exceptions_are_not_swallowed(self) -> None:
        signal = Signal(name="s")

        def interrupted(**kwargs: Any) -> None:
            raise KeyboardInterrupt

        signal.connect(interrupted)
        with pytest.raises(KeyboardInterrupt):
            signal.send(None)

    def test_send_robust_is_send(self) -> None:
        assert Signal.send_robust is Signal.send

    def test_has_listeners(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        assert not signal.has_listeners()
        signal.connect(receiver, sender="a")
        assert signal.has_listeners("a")
        assert not signal.has_listeners("b")


class TestWeakReferences:
    def test_collected_function_disconnects_itself(self) -> None:
        signal, calls = Signal(name="s"), []

        def make_receiver() -> Any:
            def receiver(**kwargs: Any) -> None:
                calls.append("called")

            return receiver

        signal.connect(make_receiver())  # nothing else holds it
        gc.collect()
        assert signal.send(None) == []
        assert signal.receivers == []
        assert calls == []

    def test_strong_reference_keeps_the_receiver(self) -> None:
        signal, calls = Signal(name="s"), []
        signal.connect(lambda **kwargs: calls.append("called"), weak=False)
        gc.collect()
        signal.send(None)
        assert calls == ["called"]

    def test_bound_method_lives_as_long_as_its_instance(self) -> None:
        signal = Signal(name="s")
        listener = Recorder()
        signal.connect(listener.__call__)  # a fresh bound-method object, dropped at once
        gc.collect()
        signal.send(None)
        assert len(listener.calls) == 1
        del listener
        gc.collect()
        assert signal.send(None) == []

    def test_bound_methods_of_two_instances_are_two_receivers(self) -> None:
        signal, first, second = Signal(name="s"), Recorder(1), Recorder(2)
        signal.connect(first.__call__)
        signal.connect(second.__call__)
        assert [response for _, response in signal.send(None)] == [1, 2]
        assert signal.disconnect(first.__call__)
        assert [response for _, response in signal.send(None)] == [2]


class TestDisconnect:
    def test_returns_whether_something_was_removed(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect(receiver, sender="a")
        signal.connect(receiver)
        assert signal.disconnect(receiver, sender="a")
        assert not signal.disconnect(receiver, sender="a")
        signal.send("a")
        assert len(receiver.calls) == 1  # the connection without a sender remains

    def test_by_dispatch_uid(self) -> None:
        signal, receiver = Signal(name="s"), Recorder()
        signal.connect(receiver, dispatch_uid="audit")
        assert signal.disconnect(dispatch_uid="audit")
        assert signal.send(None) == []

    def test_weak_argument_is_deprecated(self) -> None:
        with pytest.warns(CDeprecationWarning, match="no effect"):
            Signal(name="s").disconnect(Recorder(), weak=True)


class TestRetryingReceivers:
    def test_retries_until_success(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        pauses: list[float] = []
        monkeypatch.setattr(signals.time, "sleep", pauses.append)
        signal, attempts = Signal(name="s"), []

        def flaky(**kwargs: Any) -> str:
            attempts.append(1)
            if len(attempts) < 3:
                raise ConnectionError("not yet")
            return "done"

        wrapper = signal.connect(flaky, retry=True)
        with caplog.at_level(logging.ERROR, logger="celery.utils.dispatch.signal"):
            assert [response for _, response in signal.send(None)] == ["done"]
        assert pauses == [2, 4]
        assert len(caplog.records) == 2
        assert wrapper.__name__ == "flaky"
        # Known by the wrapped function: a second connect is a duplicate, disconnect works.
        signal.connect(flaky, retry=True)
        assert len(signal.receivers) == 1
        assert signal.disconnect(flaky)

    def test_pauses_grow_to_thirty_seconds(self) -> None:
        delays = signals._retry_delays()
        assert [next(delays) for _ in range(17)] == [
            2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 30, 30]


def test_repr() -> None:
    signal = Signal(name="shown", providing_args=["only"])
    assert repr(signal) == str(signal) == "<Signal: shown providing_args={'only'}>"


# --- differential: the same observations made on Celery 5.7 -------------------------------

KEYS = ["all", "defined", "signatures", "scenario"]


@pytest.mark.parametrize("key", KEYS)
def test_matches_celery(key: str) -> None:
    celery, ours = observed("signals")
    assert ours[key] == celery[key]


@pytest.mark.parametrize(
    "part", ["connect_forms", "object_senders", "duplicates", "weak_references",
             "failing_receivers", "repr", "defaults"],
)
def test_scenario_matches_celery(part: str) -> None:
    celery, ours = observed("signals")
    assert ours["scenario"][part] == celery["scenario"][part]


def test_probe_keys_are_all_compared() -> None:
    celery, ours = observed("signals")
    assert sorted(celery) == sorted(ours) == sorted(KEYS)
