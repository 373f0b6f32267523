"""The parts a big group is sent in, as the migration guide states them, are the workflow's
own constants."""

from __future__ import annotations

from pathlib import Path

from akadze_core.enqueue.workflow import CHUNK, FIRST_PART, PART_GROWTH

GUIDE = Path(__file__).resolve().parents[2] / "migration_guide" / "celery.md"


def test_a_big_groups_parts_are_the_workflows() -> None:
    text = " ".join(GUIDE.read_text("utf-8").split())
    first = FIRST_PART * CHUNK
    sizes = ", ".join(f"{first * PART_GROWTH ** step:,}" for step in range(3))
    assert (f"a plain group of more than {first} members in parts of {sizes}…, pipelined"
            ) in text
