"""Task state names, the sets they belong to, and their precedence (Celery's ``celery.states``).

The values are the plain strings Celery uses, so states stored or compared by
Celery code (``result.state == states.SUCCESS``) read the same here.

Precedence orders states by how "final" they are: a result that is SUCCESS or
FAILURE outranks anything still in flight. A custom state (``update_state(state="PROGRESS")``)
ranks below SUCCESS and FAILURE but above every other built-in state.
"""

from __future__ import annotations

__all__ = (
    "EXCEPTION_STATES",
    "FAILURE",
    "IGNORED",
    "PENDING",
    "PROPAGATE_STATES",
    "READY_STATES",
    "RECEIVED",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "UNREADY_STATES",
    "precedence",
    "state",
)

#: The task is not known to be anywhere further along; also the state of an unknown id.
PENDING = "PENDING"
#: A worker received the task (Celery reports this only through events).
RECEIVED = "RECEIVED"
#: A worker started the task (reported when ``task_track_started`` is on).
STARTED = "STARTED"
#: The task returned a value.
SUCCESS = "SUCCESS"
#: The task raised an exception.
FAILURE = "FAILURE"
#: The task was revoked (cancelled) before or while running.
REVOKED = "REVOKED"
#: A worker rejected the task (Celery reports this only through events).
REJECTED = "REJECTED"
#: The task raised ``Retry`` and waits for its next attempt.
RETRY = "RETRY"
#: The task raised ``Ignore``; no state is stored for it.
IGNORED = "IGNORED"

#: States after which the task will not run again: its result is ready.
READY_STATES: frozenset[str] = frozenset({SUCCESS, FAILURE, REVOKED})
#: States in which the task may still run.
UNREADY_STATES: frozenset[str] = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
#: States whose result is an exception instance.
EXCEPTION_STATES: frozenset[str] = frozenset({RETRY, FAILURE, REVOKED})
#: States whose exception ``AsyncResult.get(propagate=True)`` raises.
PROPAGATE_STATES: frozenset[str] = frozenset({FAILURE, REVOKED})
#: The states Celery lists as "all"; like Celery it leaves out REJECTED and IGNORED.
ALL_STATES: frozenset[str] = frozenset(
    {PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED}
)

#: States from highest to lowest precedence; ``None`` marks where any unknown
#: (custom) state ranks.
PRECEDENCE: list[str | None] = [
    SUCCESS,
    FAILURE,
    None,
    REVOKED,
    STARTED,
    RECEIVED,
    REJECTED,
    RETRY,
    PENDING,
]

#: Position of each entry of :data:`PRECEDENCE`, for constant-time lookups.
PRECEDENCE_LOOKUP: dict[str | None, int] = {name: index for index, name in enumerate(PRECEDENCE)}
#: The position shared by every state that is not in :data:`PRECEDENCE`.
NONE_PRECEDENCE: int = PRECEDENCE_LOOKUP[None]


def precedence(state: str | None) -> int:
    """Return the precedence index of ``state``: a smaller index means a higher precedence.

    Unknown (custom) states all share the index of ``None`` in :data:`PRECEDENCE`.
    """
    return PRECEDENCE_LOOKUP.get(state, NONE_PRECEDENCE)


class state(str):  # lower case: Celery's public name
    """A state name that compares by precedence instead of alphabetically.

    ``state(PENDING) < state(SUCCESS)`` is true, and a custom state such as
    ``state("PROGRESS")`` is greater than STARTED but less than SUCCESS.
    Equality and hashing stay those of ``str``.
    """

    # A higher precedence has a smaller index, hence the reversed comparisons.
    def __gt__(self, other: str) -> bool:
        return precedence(self) < precedence(other)

    def __ge__(self, other: str) -> bool:
        return precedence(self) <= precedence(other)

    def __lt__(self, other: str) -> bool:
        return precedence(self) > precedence(other)

    def __le__(self, other: str) -> bool:
        return precedence(self) >= precedence(other)
