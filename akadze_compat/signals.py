"""Celery's signals (``celery.signals``): the same names, the same ``Signal`` API.

Connect a receiver the way Celery code does::

    from akadze_compat.signals import task_prerun

    @task_prerun.connect
    def on_prerun(sender=None, task_id=None, task=None, **kwargs): ...

    @task_prerun.connect(sender=my_task)
    def on_my_task(**kwargs): ...

Receivers are called as ``receiver(signal=signal, sender=sender, **named)`` and must accept
``**kwargs``. Which signals the worker actually sends, with which sender and keywords, is
documented where they are sent (``akadze_compat.app.trace`` and the worker).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar, overload

from akadze_compat.exceptions import CDeprecationWarning

__all__ = (
    "after_setup_logger",
    "after_setup_task_logger",
    "after_task_publish",
    "beat_embedded_init",
    "beat_init",
    "before_task_publish",
    "celeryd_after_setup",
    "celeryd_init",
    "eventlet_pool_apply",
    "eventlet_pool_postshutdown",
    "eventlet_pool_preshutdown",
    "eventlet_pool_started",
    "heartbeat_sent",
    "setup_logging",
    "task_failure",
    "task_internal_error",
    "task_postrun",
    "task_prerun",
    "task_received",
    "task_rejected",
    "task_retry",
    "task_revoked",
    "task_success",
    "task_unknown",
    "worker_before_create_process",
    "worker_init",
    "worker_process_init",
    "worker_process_shutdown",
    "worker_ready",
    "worker_shutdown",
    "worker_shutting_down",
)

# Celery logs failing receivers under this name; keeping it means logging configurations
# written for Celery (e.g. a handler on the "celery" logger) still see these errors.
logger = logging.getLogger("celery.utils.dispatch.signal")

ReceiverT = TypeVar("ReceiverT", bound=Callable[..., Any])

#: A connection: ((receiver key, sender key), the receiver or a weak reference to it).
Connection = tuple[tuple[Hashable, Hashable], Any]


def _identity_key(obj: object) -> Hashable:
    """The key receivers and senders are matched by.

    Strings (and bytes) match by value, so ``connect(sender="proj.tasks.add")`` matches a
    signal sent with the task name as sender (``before_task_publish``, ``after_task_publish``).
    A bound method is keyed by its instance and function, because every attribute access
    creates a new method object. Anything else matches by identity. A lazy proxy (an object
    whose class has ``_get_current_object``) stands for the object it wraps.
    """
    if callable(getattr(type(obj), "_get_current_object", None)):
        obj = obj._get_current_object()  # type: ignore[attr-defined]
    if isinstance(obj, (str, bytes)):
        return obj
    if hasattr(obj, "__func__"):
        return (id(getattr(obj, "__self__", None)), id(obj.__func__))
    return id(obj)


#: The sender key of receivers connected without a sender: they receive from every sender.
_ANY_SENDER = _identity_key(None)


def _connection_key(
    receiver: Callable[..., Any] | None, sender: object, dispatch_uid: Hashable | None
) -> tuple[Hashable, Hashable]:
    """The key that makes a connection unique: who receives (or its dispatch_uid), from whom."""
    if dispatch_uid:
        receiver_key: Hashable = dispatch_uid
    elif (wrapped_uid := getattr(receiver, "_dispatch_uid", None)) is not None:
        # A retrying wrapper is known by the receiver it wraps (see _retrying).
        receiver_key = wrapped_uid
    else:
        receiver_key = _identity_key(receiver)
    return (receiver_key, _identity_key(sender))


def _accepts_any_keyword(func: Callable[..., Any]) -> bool:
    """Whether ``func`` takes ``**kwargs`` (signals may grow new keywords at any time)."""
    code = getattr(func, "__code__", None)
    if code is not None:
        # Read the code flags rather than inspect.signature(), which evaluates annotations.
        return bool(code.co_flags & inspect.CO_VARKEYWORDS)
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)


def _retry_delays() -> Iterator[float]:
    """Seconds to wait between attempts of a ``retry=True`` receiver: 2, 4, ... then 30 forever.

    These are kombu's ``retry_over_time`` defaults, which Celery uses for such receivers.
    """
    return itertools.chain(range(2, 30, 2), itertools.repeat(30))


def _retrying(receiver: Callable[..., Any], dispatch_uid: Hashable) -> Callable[..., Any]:
    """Wrap ``receiver`` so a failing call is retried (and logged) until it succeeds."""

    @functools.wraps(receiver)
    def call_until_success(*args: Any, **kwargs: Any) -> Any:
        for delay in _retry_delays():
            try:
                return receiver(*args, **kwargs)
            except Exception:
                logger.exception(
                    "Could not process signal receiver %r. Retrying in %s seconds...",
                    receiver,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable: the retry delays never end")

    call_until_success._dispatch_uid = dispatch_uid  # type: ignore[attr-defined]
    return call_until_success


class Signal:
    """A named event that receivers connect to and senders send (the Observer pattern).

    ``providing_args`` documents the keywords the signal is sent with; ``use_caching`` is
    accepted for compatibility and has no effect (lookups are not cached).
    """

    #: The connections, oldest first: ``((receiver key, sender key), receiver or weakref)``.
    receivers: list[Connection]

    def __init__(
        self,
        providing_args: Iterable[str] | None = None,
        use_caching: bool = False,
        name: str | None = None,
    ) -> None:
        self.receivers = []
        self.providing_args: set[str] = set(providing_args or ())
        self.use_caching = use_caching
        self.name = name
        self.lock = threading.Lock()
        # Set from weakref callbacks, which can run in the middle of garbage collection while
        # this thread already holds the lock; the dead entries are dropped later, under it.
        self._has_dead_receivers = False

    @overload
    def connect(
        self,
        receiver: ReceiverT,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Hashable | None = None,
        retry: bool = False,
    ) -> ReceiverT: ...

    @overload
    def connect(
        self,
        receiver: None = None,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Hashable | None = None,
        retry: bool = False,
    ) -> Callable[[ReceiverT], ReceiverT]: ...

    def connect(
        self,
        receiver: Any = None,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Hashable | None = None,
        retry: bool = False,
    ) -> Any:
        """Connect ``receiver`` to this signal; without a receiver, return a decorator.

        Usable as ``@signal.connect``, ``@signal.connect(sender=...)`` and
        ``signal.connect(func)``. A receiver connected with a ``sender`` is only called when
        the signal is sent by that sender. ``weak=True`` (the default) holds the receiver by
        weak reference, so a receiver that is garbage collected disconnects itself (keep a
        reference to lambdas and closures, or pass ``weak=False``). A second connection with
        the same receiver (or ``dispatch_uid``) and sender is ignored. ``retry=True`` calls
        a failing receiver again, with growing pauses, until it succeeds; the decorator then
        returns the retrying wrapper, as Celery does.
        """
        if receiver is not None and not callable(receiver):
            # Celery reads a non-callable first positional argument as the sender.
            if sender is not None:
                raise TypeError("Signal receivers must be callable")
            receiver, sender = None, receiver

        def connect_receiver(function: ReceiverT) -> ReceiverT:
            return self._connect(function, sender, weak, dispatch_uid, retry)

        if receiver is None:
            return connect_receiver
        return connect_receiver(receiver)

    def _connect(
        self,
        receiver: ReceiverT,
        sender: Any,
        weak: bool,
        dispatch_uid: Hashable | None,
        retry: bool,
    ) -> ReceiverT:
        if not callable(receiver):
            raise TypeError("Signal receivers must be callable")
        if not _accepts_any_keyword(receiver):
            raise ValueError("Signal receiver must accept keyword arguments.")
        if retry:
            # The wrapper is a new object each time; keying it by the wrapped receiver
            # keeps disconnect(receiver) and duplicate detection working.
            dispatch_uid = dispatch_uid or _identity_key(receiver)
            receiver = _retrying(receiver, dispatch_uid)  # type: ignore[assignment]
            weak = False  # nothing else references the wrapper
        key = _connection_key(receiver, sender, dispatch_uid)
        stored: Any = self._weak_reference(receiver) if weak else receiver
        with self.lock:
            self._drop_dead_receivers()
            if all(existing_key != key for existing_key, _ in self.receivers):
                self.receivers.append((key, stored))
        return receiver

    def _weak_reference(self, receiver: Callable[..., Any]) -> weakref.ref[Any]:
        # A bound method object dies as soon as the caller drops it, even while its
        # instance lives on; WeakMethod follows the instance and the function instead.
        if hasattr(receiver, "__self__") and hasattr(receiver, "__func__"):
            return weakref.WeakMethod(receiver, self._note_dead_receiver)
        return weakref.ref(receiver, self._note_dead_receiver)

    def _note_dead_receiver(self, _reference: object) -> None:
        self._has_dead_receivers = True

    def _drop_dead_receivers(self) -> None:
        # The caller holds self.lock.
        if not self._has_dead_receivers:
            return
        self._has_dead_receivers = False
        self.receivers[:] = [
            (key, stored)
            for key, stored in self.receivers
            if not (isinstance(stored, weakref.ref) and stored() is None)
        ]

    def disconnect(
        self,
        receiver: Callable[..., Any] | None = None,
        sender: Any = None,
        weak: bool | None = None,
        dispatch_uid: Hashable | None = None,
    ) -> bool:
        """Disconnect the connection made with this receiver (or ``dispatch_uid``) and sender.

        Returns whether a connection was removed. ``weak`` is accepted for compatibility
        and has no effect (Celery warns about it too).
        """
        if weak is not None:
            warnings.warn(
                "Passing `weak` to disconnect has no effect.", CDeprecationWarning, stacklevel=2
            )
        key = _connection_key(receiver, sender, dispatch_uid)
        with self.lock:
            self._drop_dead_receivers()
            for index, (existing_key, _) in enumerate(self.receivers):
                if existing_key == key:
                    del self.receivers[index]
                    return True
        return False

    def has_listeners(self, sender: Any = None) -> bool:
        """Whether a live receiver would be called if ``sender`` sent this signal."""
        return bool(self._live_receivers(sender))

    def _live_receivers(self, sender: Any) -> list[Callable[..., Any]]:
        """The receivers for ``sender`` that are still alive, in connection order."""
        sender_key = _identity_key(sender)
        with self.lock:
            self._drop_dead_receivers()
            matching = [
                stored
                for (_, connected_sender), stored in self.receivers
                if connected_sender in (_ANY_SENDER, sender_key)
            ]
        live = []
        for stored in matching:
            receiver = stored() if isinstance(stored, weakref.ref) else stored
            if receiver is not None:
                live.append(receiver)
        return live

    def send(self, sender: Any, **named: Any) -> list[tuple[Callable[..., Any], Any]]:
        """Call every receiver connected for ``sender``; return ``[(receiver, response), ...]``.

        Each receiver is called as ``receiver(signal=self, sender=sender, **named)``. As in
        Celery, sending is always robust: an ``Exception`` raised by a receiver is logged,
        becomes that receiver's response, and the remaining receivers are still called.
        """
        responses: list[tuple[Callable[..., Any], Any]] = []
        if not self.receivers:
            return responses
        for receiver in self._live_receivers(sender):
            try:
                response = receiver(signal=self, sender=sender, **named)
            except Exception as exc:  # one broken receiver must not silence the others
                logger.exception("Signal handler %r raised: %r", receiver, exc)
                responses.append((receiver, exc))
            else:
                responses.append((receiver, response))
        return responses

    #: Django's name for robust sending; in Celery both names do the same thing.
    send_robust = send

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name} providing_args={self.providing_args!r}>"

    __str__ = __repr__


# --- Tasks ------------------------------------------------------------------------------
before_task_publish = Signal(
    name="before_task_publish",
    providing_args={
        "body", "exchange", "routing_key", "headers", "properties", "declare", "retry_policy",
    },
)
after_task_publish = Signal(
    name="after_task_publish", providing_args={"body", "exchange", "routing_key"}
)
task_received = Signal(name="task_received", providing_args={"request"})
task_prerun = Signal(name="task_prerun", providing_args={"task_id", "task", "args", "kwargs"})
task_postrun = Signal(
    name="task_postrun", providing_args={"task_id", "task", "args", "kwargs", "retval"}
)
task_success = Signal(name="task_success", providing_args={"result", "runtime"})
task_retry = Signal(name="task_retry", providing_args={"request", "reason", "einfo"})
task_failure = Signal(
    name="task_failure",
    providing_args={"task_id", "exception", "args", "kwargs", "traceback", "einfo"},
)
task_internal_error = Signal(
    name="task_internal_error",
    providing_args={
        "task_id", "args", "kwargs", "request", "exception", "traceback", "einfo",
    },
)
task_revoked = Signal(
    name="task_revoked", providing_args={"request", "terminated", "signum", "expired"}
)
task_rejected = Signal(name="task_rejected", providing_args={"message", "exc"})
task_unknown = Signal(name="task_unknown", providing_args={"message", "exc", "name", "id"})
#: Deprecated in Celery (use after_task_publish); defined so old imports keep working.
task_sent = Signal(
    name="task_sent", providing_args={"task_id", "task", "args", "kwargs", "eta", "taskset"}
)

# --- The worker program -----------------------------------------------------------------
celeryd_init = Signal(name="celeryd_init", providing_args={"instance", "conf", "options"})
celeryd_after_setup = Signal(name="celeryd_after_setup", providing_args={"instance", "conf"})

# --- The worker -------------------------------------------------------------------------
import_modules = Signal(name="import_modules")
worker_init = Signal(name="worker_init")
worker_before_create_process = Signal(name="worker_before_create_process")
worker_process_init = Signal(name="worker_process_init")
worker_process_shutdown = Signal(name="worker_process_shutdown")
worker_ready = Signal(name="worker_ready")
worker_shutdown = Signal(name="worker_shutdown")
worker_shutting_down = Signal(name="worker_shutting_down")
heartbeat_sent = Signal(name="heartbeat_sent")

# --- Logging ----------------------------------------------------------------------------
setup_logging = Signal(
    name="setup_logging", providing_args={"loglevel", "logfile", "format", "colorize"}
)
after_setup_logger = Signal(
    name="after_setup_logger",
    providing_args={"logger", "loglevel", "logfile", "format", "colorize"},
)
after_setup_task_logger = Signal(
    name="after_setup_task_logger",
    providing_args={"logger", "loglevel", "logfile", "format", "colorize"},
)

# --- Beat -------------------------------------------------------------------------------
beat_init = Signal(name="beat_init")
beat_embedded_init = Signal(name="beat_embedded_init")

# --- Eventlet pool (never sent here: there is no eventlet pool; defined for imports) -----
eventlet_pool_started = Signal(name="eventlet_pool_started")
eventlet_pool_preshutdown = Signal(name="eventlet_pool_preshutdown")
eventlet_pool_postshutdown = Signal(name="eventlet_pool_postshutdown")
eventlet_pool_apply = Signal(
    name="eventlet_pool_apply", providing_args={"target", "args", "kwargs"}
)

# --- Command-line programs --------------------------------------------------------------
user_preload_options = Signal(name="user_preload_options", providing_args={"app", "options"})
