"""``celery.bootsteps``: custom worker boot steps, run by ``akadze-compat worker``.

A step class added to ``app.steps["worker"]`` (or ``app.steps["consumer"]``) is created when
the worker is set up, after ``worker_init`` (``Step(worker)``, then ``include_if`` /
``create``); a ``StartStopStep`` is started before the worker claims its first task (before
``worker_ready``) and stopped, in reverse order, when it stops (before ``worker_shutdown``),
as in Celery. Steps start and stop in the worker's main process, ordered by their
``requires`` among themselves. Each prefork child creates them too (``__init__``,
``include_if``, ``create``), never starting them: Celery's children are forks of the process
that created them, so what a step set up there (the signal receivers django-structlog's step
connects) is in the child that runs the task. A requirement naming one of Celery's own
steps (``celery.worker.components:Timer``) is met already: akadze's worker plays their
parts. The worker they get is ``akadze_compat.bin.worker.WorkController``: ``app``,
``hostname``, ``pid``, ``steps``, ``blueprint`` (the created steps), and a ``timer`` with
``call_repeatedly`` / ``call_after`` (the liveness-probe recipe uses it).

What differs: consumer steps get the worker too (there is no kombu consumer), and a
``ConsumerStep``, which consumes from a kombu channel, imports but refuses to start (the
worker says why and exits).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kombu.utils.imports import symbol_by_name

__all__ = ["Blueprint", "ConsumerStep", "StartStopStep", "Step", "StepType"]

#: Why a ``ConsumerStep`` cannot run here (the worker refuses to start with one); the
#: support table (``akadze_compat.support``) says the same.
CONSUMER_STEP = ("a ConsumerStep adds kombu consumers (get_consumers(channel)) to the "
                 "worker's broker connection; akadze's worker has no kombu connection or "
                 "channel: it claims jobs from Postgres. Consume another broker from a "
                 "StartStopStep of your own (its start/stop run with the worker), or send "
                 "those messages as tasks")

logger = logging.getLogger("celery.bootsteps")


class StepType(type):
    """Names each step class ``module.Class`` (its ``name`` unless it sets one)."""

    name: str | None = None
    requires: Any = None

    def __new__(cls, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> StepType:
        module = attrs.get("__module__")
        qualified = f"{module}.{name}" if module else name
        attrs.update(__qualname__=qualified, name=attrs.get("name") or qualified)
        return super().__new__(cls, name, bases, attrs)

    def __str__(cls) -> str:
        return str(cls.name)

    def __repr__(cls) -> str:
        return f"step:{cls.name}{{{cls.requires!r}}}"


class Step(metaclass=StepType):
    """A boot step: ``__init__(parent)`` runs when the worker is set up, then ``create``
    when ``include_if`` says the step is wanted."""

    name: str | None = None
    #: A short name for logs (default: the class name).
    label: str | None = None
    conditional = False
    #: Steps (classes or ``"module:Class"`` names) to create and start before this one.
    requires: Any = ()
    last = False
    #: The default answer of :meth:`include_if`.
    enabled = True

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        pass

    def include_if(self, parent: Any) -> bool:
        """Whether the step is wanted in ``parent``."""
        return self.enabled

    def instantiate(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """An instance of the class named ``name`` (``"module:Class"``)."""
        return symbol_by_name(name)(*args, **kwargs)

    def _should_include(self, parent: Any) -> tuple[bool, Any]:
        if self.include_if(parent):
            return True, self.create(parent)
        return False, None

    def include(self, parent: Any) -> bool:
        """Create the step in ``parent`` if it is wanted; whether it was."""
        return self._should_include(parent)[0]

    def create(self, parent: Any) -> Any:
        """Make what the step runs (a ``StartStopStep`` keeps it as ``obj``)."""

    def __repr__(self) -> str:
        return f"<step: {self.alias}>"

    @property
    def alias(self) -> str:
        """The label, else the last part of the name."""
        return self.label or str(self.name).rsplit(".", 1)[-1]

    def info(self, obj: Any) -> Any:
        """What the step adds to the worker's ``inspect stats`` (nothing by default)."""


class StartStopStep(Step):
    """A step the worker starts when it starts and stops when it stops; by default it starts
    and stops ``obj``, what ``create`` returned."""

    obj: Any = None

    def start(self, parent: Any) -> Any:
        """Start the step (``obj.start()``)."""
        if self.obj:
            return self.obj.start()
        return None

    def stop(self, parent: Any) -> Any:
        """Stop the step (``obj.stop()``)."""
        if self.obj:
            return self.obj.stop()
        return None

    def close(self, parent: Any) -> None:
        """Release what the step holds, after it stopped."""

    def terminate(self, parent: Any) -> Any:
        """Stop at once (``obj.terminate()``, else ``obj.stop()``)."""
        if self.obj:
            return getattr(self.obj, "terminate", self.obj.stop)()
        return None

    def include(self, parent: Any) -> bool:
        included, self.obj = self._should_include(parent)
        if included:
            parent.steps.append(self)
        return included


def _requirement_name(requirement: Any) -> str:
    if isinstance(requirement, str):
        return requirement.replace(":", ".")
    return str(getattr(requirement, "name", requirement))


def ordered(steps: Iterable[type[Step]]) -> list[type[Step]]:
    """``steps`` with each after the ones it requires (by name, otherwise by name order);
    requirements outside ``steps`` are Celery's own steps, met already."""
    by_name = {str(step.name): step for step in sorted(steps, key=lambda s: str(s.name))}
    order: list[type[Step]] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        step = by_name[name]
        if step in order:
            return
        if name in visiting:
            raise ValueError(f"boot steps require each other in a cycle: {name}")
        visiting.add(name)
        for requirement in step.requires or ():
            required = _requirement_name(requirement)
            if required in by_name:
                visit(required)
        visiting.discard(name)
        order.append(step)

    for name in by_name:
        visit(name)
    return order


class Blueprint:
    """A group of steps run together on one parent: ``apply`` creates them, ``start``
    starts the StartStopSteps in order, ``stop`` stops them in reverse."""

    def __init__(self, steps: Iterable[Any] | None = None, name: str | None = None,
                 **kwargs: Any) -> None:
        self.name = name or type(self).__name__
        self.types = {symbol_by_name(step) if isinstance(step, str) else step
                      for step in steps or ()}
        self.steps: dict[str, Step] = {}

    def apply(self, parent: Any, **kwargs: Any) -> Blueprint:
        """Create every step on ``parent`` (its ``steps`` list gets the StartStopSteps)."""
        for step_type in ordered(self.types):
            step = step_type(parent, **kwargs)
            self.steps[str(step.name)] = step
            step.include(parent)
        return self

    def start(self, parent: Any) -> None:
        """Start ``parent``'s started steps, in order."""
        for step in parent.steps:
            logger.debug("| %s: Starting %s", self.name, step.alias)
            step.start(parent)

    def stop(self, parent: Any, close: bool = True, terminate: bool = False) -> None:
        """Stop ``parent``'s steps in reverse order (each one's failure is logged, the
        others still stop), then close them."""
        for step in reversed(parent.steps):
            try:
                (step.terminate if terminate else step.stop)(parent)
                if close:
                    step.close(parent)
            except Exception:
                logger.exception("Error while stopping boot step %s", step.alias)

    def __getitem__(self, name: str) -> Step:
        return self.steps[name]


class ConsumerStep(StartStopStep):
    """Celery's step that adds kombu consumers to the worker's broker connection: it imports
    and can be subclassed and added to ``app.steps["consumer"]``, but starting it raises
    ``NotImplementedError`` (the worker then refuses to start, saying why): akadze's worker
    has no kombu connection to open a channel on (``CONSUMER_STEP``)."""

    requires: Any = ("celery.worker.consumer:Connection",)
    #: The kombu consumers ``get_consumers`` returned (never any here).
    consumers: Any = None

    def get_consumers(self, channel: Any) -> Any:
        """The kombu consumers to add, on ``channel`` (the subclass says)."""
        raise NotImplementedError("missing get_consumers")

    def start(self, parent: Any) -> Any:
        """Refuse: there is no channel to give ``get_consumers``."""
        raise NotImplementedError(f"{type(self).__name__} (a bootsteps.ConsumerStep) cannot "
                                  f"run on akadze: {CONSUMER_STEP}")

    def stop(self, parent: Any) -> Any:
        """Nothing to stop: it never started."""
        return None

    def shutdown(self, parent: Any) -> Any:
        """Nothing to close."""
        return None
