"""akadze_compat.states: Celery's state names, sets and precedence."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import akadze_compat
from akadze_compat import states
from akadze_compat.states import state
from tests.compat.differential import observed

BUILT_IN = ["PENDING", "RECEIVED", "STARTED", "SUCCESS", "FAILURE", "REVOKED", "REJECTED",
            "RETRY", "IGNORED"]


def test_constants_are_their_own_names() -> None:
    assert [getattr(states, name) for name in BUILT_IN] == BUILT_IN


def test_sets() -> None:
    assert sorted(states.READY_STATES) == ["FAILURE", "REVOKED", "SUCCESS"]
    assert sorted(states.UNREADY_STATES) == ["PENDING", "RECEIVED", "REJECTED", "RETRY",
                                             "STARTED"]
    assert sorted(states.EXCEPTION_STATES) == ["FAILURE", "RETRY", "REVOKED"]
    assert sorted(states.PROPAGATE_STATES) == ["FAILURE", "REVOKED"]
    # Celery's "all" leaves out REJECTED and IGNORED; code testing membership relies on it.
    assert sorted(states.ALL_STATES) == ["FAILURE", "PENDING", "RECEIVED", "RETRY", "REVOKED",
                                         "STARTED", "SUCCESS"]
    assert isinstance(states.READY_STATES, frozenset)


def test_ready_and_unready_do_not_overlap() -> None:
    assert not states.READY_STATES & states.UNREADY_STATES


def test_precedence_order() -> None:
    ranked = sorted(BUILT_IN[:-1], key=states.precedence)  # IGNORED ranks as unknown
    assert ranked == ["SUCCESS", "FAILURE", "REVOKED", "STARTED", "RECEIVED", "REJECTED",
                      "RETRY", "PENDING"]


def test_unknown_states_share_the_slot_of_none() -> None:
    assert states.precedence("PROGRESS") == states.precedence(None) == states.NONE_PRECEDENCE
    assert states.precedence("IGNORED") == states.NONE_PRECEDENCE
    assert states.precedence("success") == states.NONE_PRECEDENCE  # case matters


def test_state_compares_by_precedence() -> None:
    assert state(states.PENDING) < state(states.SUCCESS)
    assert state("PROGRESS") > state(states.STARTED)
    assert not state("PROGRESS") > state(states.SUCCESS)
    assert state(states.FAILURE) >= states.FAILURE
    assert state(states.RETRY) <= states.RETRY
    # A plain str on the left defers to the subclass's reflected comparison.
    plain = states.SUCCESS
    assert plain > state(states.PENDING)


def test_state_sorts_from_lowest_to_highest_precedence() -> None:
    ordered = sorted(state(name) for name in ["SUCCESS", "PENDING", "PROGRESS", "STARTED"])
    assert ordered == ["PENDING", "STARTED", "PROGRESS", "SUCCESS"]


def test_state_stays_a_str() -> None:
    assert state("SUCCESS") == "SUCCESS"
    assert hash(state("SUCCESS")) == hash("SUCCESS")
    assert {state("SUCCESS"): 1}["SUCCESS"] == 1


def test_all_names_exist() -> None:
    for name in states.__all__:
        assert hasattr(states, name), name


def test_facade_never_imports_celery() -> None:
    """The contract: akadze_compat runs without Celery installed."""
    offenders = []
    for path in Path(akadze_compat.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            offenders += [f"{path.name}:{node.lineno} {module}" for module in modules
                          if module == "celery" or module.startswith("celery.")]
    assert offenders == []


# --- differential: the same observations made on Celery 5.7 -------------------------------

KEYS = ["all", "constants", "sets", "set_types", "PRECEDENCE", "PRECEDENCE_LOOKUP",
        "NONE_PRECEDENCE", "precedence", "comparisons", "sorted", "state_is_str", "state_hash"]


@pytest.mark.parametrize("key", KEYS)
def test_matches_celery(key: str) -> None:
    celery, ours = observed("states")
    assert ours[key] == celery[key]


def test_probe_keys_are_all_compared() -> None:
    celery, ours = observed("states")
    assert sorted(celery) == sorted(ours) == sorted(KEYS)
