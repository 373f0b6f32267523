"""Task ids derived from job ids: the external id of a job that was given none.

Integrations give a job an external id in ``meta["task_id"]`` (the Celery facade: a uuid4
string per ``delay()``), found through ``jobs_meta_task_id_idx``. A job without one is
known by an id computed from its job id and the database's key (``akadze.task_id_key``,
drawn once by migration 0014), shaped like a uuid4 (version 4, RFC 4122 variant), so that
code storing Celery task ids in UUID columns takes it:

- the first 60 free bits (the uuid's first half, version digit aside) are the MD5 of the
  key's second half and the job id: different for every job, and a check that the id was
  derived here (a uuid4 drawn at random passes it once in 2**60 times);
- the last 62 (after the variant bits) are the job id, spread over all 62 bits by an odd
  multiplier and XORed with a mask (the key's first half): the job is found again from
  the id alone, through the primary key.

Nothing is stored per job for it and nothing is indexed: a group of 10,000 members sent
without chosen ids inserts as fast as plain jobs. Job ids must stay below 2**62.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

__all__ = ["TaskIds"]

_LOW_BITS = (1 << 62) - 1
# The job id times an odd number, modulo 2**62 (a bijection, undone by its inverse), so
# that consecutive jobs' ids differ in every digit rather than in the last few.
_SPREAD = 0x2545F4914F6CDD1D & _LOW_BITS
_UNSPREAD = pow(_SPREAD, -1, 1 << 62)
_VARIANT = 1 << 63  # RFC 4122's variant: the top two bits of the second half are 10
_HEX = frozenset("0123456789abcdef")


@dataclasses.dataclass(frozen=True, slots=True)
class TaskIds:
    """The derived task ids of one database (its key: 32 hex digits)."""

    key: str
    _mask: int = dataclasses.field(init=False, repr=False)
    _salt: bytes = dataclasses.field(init=False, repr=False)
    # The MD5 state after the salt, copied per id: cheaper than hashing the salt again.
    _salted: Any = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.key) != 32 or not set(self.key) <= _HEX:
            raise ValueError("a task id key is 32 lowercase hex digits")
        object.__setattr__(self, "_mask", int(self.key[:16], 16) & _LOW_BITS)
        object.__setattr__(self, "_salt", self.key[16:].encode())
        object.__setattr__(self, "_salted", hashlib.md5(self._salt, usedforsecurity=False))

    def derive(self, job_id: int) -> str:
        """The task id of job ``job_id``."""
        digest = self._salted.copy()
        digest.update(b"%d" % job_id)
        tag = digest.hexdigest()
        # The second half's 16 hex digits at once, split: one format, not two.
        low = "%016x" % (_VARIANT | (((job_id * _SPREAD) & _LOW_BITS) ^ self._mask))
        return f"{tag[:8]}-{tag[8:12]}-4{tag[13:16]}-{low[:4]}-{low[4:]}"

    def of(self, job_id: int, meta: object) -> str:
        """The id a job is known by: its ``meta["task_id"]`` when it has one, else its
        derived id."""
        given = meta.get("task_id") if isinstance(meta, dict) else None
        return str(given) if given is not None else self.derive(job_id)

    def job_id(self, task_id: str) -> int | None:
        """The job whose derived id ``task_id`` is, or None when it is not one of ours (a
        uuid chosen elsewhere, any other string). The job may not exist (any more), and
        may have an id of its own in its meta: the caller reads it to know."""
        if len(task_id) != 36 or task_id[14] != "4" or task_id[19] not in "89ab" \
                or not set(task_id) <= _HEX | {"-"}:
            return None
        try:
            low = int(task_id[19:23] + task_id[24:], 16)
        except ValueError:
            return None
        job_id = (((low & _LOW_BITS) ^ self._mask) * _UNSPREAD) & _LOW_BITS
        return job_id if job_id > 0 and self.derive(job_id) == task_id else None
