"""legacyproj: an old Celery project moved to akadze_compat by renaming its imports only.

It is full, on purpose, of what akadze_compat ignores, changes or lacks (pre-4.0 setting
names, pickle, rate limits, canvas, remote control, signals never sent): the doctor test
(`tests/compat/test_doctor.py`) checks that `akadze-compat -A legacyproj doctor` reports each.
"""

from .celery import app as celery_app

__all__ = ("celery_app",)
