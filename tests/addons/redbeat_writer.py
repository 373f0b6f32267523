"""Entries saved by celery-redbeat itself, as its docs show, in its own key layout.

``python redbeat_writer.py REDIS PREFIX``: a ``beat_schedule`` entry stored by RedBeat's
scheduler at start (a static), and entries added at run time with
``RedBeatSchedulerEntry(...).save()``: an interval, a crontab, a disabled one, one with
options, an rrule and a crontab restricting both days. Prints the keys it wrote.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

from celery import Celery
from celery.schedules import crontab, schedule
from redbeat import RedBeatScheduler, RedBeatSchedulerEntry
from redbeat.schedules import rrule

REDIS, PREFIX = sys.argv[1], sys.argv[2]
app = Celery("rb", broker=REDIS)
app.conf.redbeat_redis_url = REDIS
app.conf.redbeat_key_prefix = PREFIX
app.conf.timezone = "UTC"
app.conf.beat_schedule = {"static-ping": {"task": "rb.ping", "schedule": 60.0}}

RedBeatScheduler(app=app).setup_schedule()
RedBeatSchedulerEntry("every-30s", "rb.add", schedule(30), args=[2, 3], app=app).save()
RedBeatSchedulerEntry("nightly", "rb.report", crontab(minute=15, hour=3),
                      kwargs={"kind": "daily"}, app=app).save()
off = RedBeatSchedulerEntry("switched-off", "rb.add", schedule(90), args=[1, 1], app=app)
off.enabled = False
off.save()
RedBeatSchedulerEntry("routed", "rb.add", schedule(45), args=[0, 0],
                      options={"queue": "reports", "priority": 5}, app=app).save()
RedBeatSchedulerEntry("by-rrule", "rb.add",
                      rrule("MINUTELY", dtstart=datetime(2026, 1, 1, tzinfo=timezone.utc)),
                      app=app).save()
RedBeatSchedulerEntry("both-days", "rb.add",
                      crontab(minute=0, hour=0, day_of_month=13, day_of_week="fri"),
                      app=app).save()
from redbeat.schedulers import get_redis  # noqa: E402

client = get_redis(app)
print(json.dumps(sorted(key.decode() if isinstance(key, bytes) else key
                        for key in client.zrange(PREFIX + ":schedule", 0, -1))))
