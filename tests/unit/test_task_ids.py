"""Task ids derived from job ids (akadze_core.model.task_ids): uuid4-shaped, one per job and
database, found again from the id alone, and never mistaken for a uuid drawn elsewhere."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze_core.model.task_ids import TaskIds

KEY = "3f2a9c1e77b14c3d8a5b6e0f1d2c3b4a"
job_ids = st.integers(min_value=1, max_value=(1 << 62) - 1)


@given(job_ids)
def test_an_id_is_a_uuid4_and_leads_back_to_its_job(job_id: int) -> None:
    codec = TaskIds(KEY)
    task_id = codec.derive(job_id)
    parsed = uuid.UUID(task_id)
    assert str(parsed) == task_id  # lowercase, dashed: as Celery's uuid() gives them
    assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert codec.job_id(task_id) == job_id
    assert codec.derive(job_id + 1) != task_id


@pytest.mark.parametrize(("job_id", "task_id"), [
    (1, "685f7e45-113f-431b-9a6f-688f38dd9120"),
    (12345, "7499ebdc-43ae-4743-9544-2f216f03e748"),
    ((1 << 62) - 1, "67b32e90-ea7e-4ada-a590-9770c7226ede"),
])
def test_an_id_is_the_same_in_every_version(job_id: int, task_id: str) -> None:
    # Nothing stores a derived id: every process (old and new workers, clients, the
    # dashboard) computes it, so the same job must get the same id from any of them.
    assert TaskIds(KEY).derive(job_id) == task_id
    assert TaskIds(KEY).job_id(task_id) == job_id


def test_ids_differ_per_job_and_per_database() -> None:
    codec, other = TaskIds(KEY), TaskIds("0" * 32)
    mine = [codec.derive(job_id) for job_id in range(1, 2001)]
    assert len(set(mine)) == 2000
    assert set(mine).isdisjoint(other.derive(job_id) for job_id in range(1, 2001))
    # Consecutive jobs differ all along the id, not only in its last digits.
    assert mine[0][24:30] != mine[1][24:30] and mine[0][:8] != mine[1][:8]
    assert {other.job_id(task_id) for task_id in mine} == {None}


@given(st.uuids(version=4))
def test_a_uuid_drawn_elsewhere_is_not_taken_for_a_derived_one(drawn: uuid.UUID) -> None:
    assert TaskIds(KEY).job_id(str(drawn)) is None


@pytest.mark.parametrize("text", ["", "42", "not a uuid", "x" * 36,
                                  "00000000-0000-4000-8000-000000000001"])
def test_other_strings_are_not_derived_ids(text: str) -> None:
    assert TaskIds(KEY).job_id(text) is None


def test_a_derived_id_changed_anywhere_is_refused() -> None:
    codec = TaskIds(KEY)
    task_id = codec.derive(12345)
    for at in (0, 9, 15, 20, 35):
        digit = "0" if task_id[at] != "0" else "1"
        assert codec.job_id(task_id[:at] + digit + task_id[at + 1:]) is None
    assert codec.job_id(task_id.upper()) is None


@pytest.mark.parametrize("key", ["", "0" * 31, "g" * 32, "A" * 32])
def test_a_bad_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        TaskIds(key)
