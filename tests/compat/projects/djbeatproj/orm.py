"""The Django side of the django_celery_beat test: what an admin or the ORM does.

Run with the interpreter that has Django and django_celery_beat (which imports Celery):
``python orm.py migrate | setup | edit``, with ``DJBEATPROJ_DATABASE_URL`` set. ``setup``
prints ``{name: id}`` of the periodic tasks it made, as JSON.
"""

import json
import os
import sys
from datetime import timedelta
from zoneinfo import ZoneInfo

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule,
    CrontabSchedule,
    IntervalSchedule,
    PeriodicTask,
)

TASK = "reports.tasks.record"


def every(seconds):
    return IntervalSchedule.objects.get_or_create(every=seconds,
                                                  period=IntervalSchedule.SECONDS)[0]


def setup():
    now = timezone.now()
    hour = now.astimezone(ZoneInfo("Asia/Kolkata")).hour
    made = []

    def task(name, **fields):
        made.append(PeriodicTask.objects.create(name=name, task=TASK, **fields))

    task("interval", interval=every(3), kwargs=json.dumps({"label": "interval"}),
         headers=json.dumps({"tenant": "acme"}), priority=3)
    # Every minute of this hour in Kolkata, last run 3 minutes ago: overdue, runs at once.
    # The same hour read in New York is hours away: it does not run.
    for name, zone in (("cron-kolkata", "Asia/Kolkata"), ("cron-newyork", "America/New_York")):
        cron = CrontabSchedule.objects.create(minute="*", hour=str(hour), timezone=zone)
        task(name, crontab=cron, args=json.dumps([name]),
             last_run_at=now - timedelta(minutes=3))
    task("oneoff", interval=every(1), one_off=True, args=json.dumps(["oneoff"]))
    for name, offset in (("clocked-past", -10), ("clocked-soon", 6)):
        clocked = ClockedSchedule.objects.create(clocked_time=now + timedelta(seconds=offset))
        task(name, clocked=clocked, one_off=True, args=json.dumps([name]))
    task("disabled", interval=every(1), enabled=False, args=json.dumps(["disabled"]))
    task("expiring", interval=every(1), expires=now + timedelta(seconds=8),
         args=json.dumps(["expiring"]))
    task("starts-later", interval=every(1), start_time=now + timedelta(seconds=6),
         args=json.dumps(["starts-later"]))
    task("to-disable", interval=every(1), args=json.dumps(["to-disable"]))
    task("queued", interval=every(2), queue="special", expire_seconds=30,
         args=json.dumps(["queued"]), kwargs=json.dumps({"n": 1}))
    print(json.dumps({"now": now.isoformat(), "ids": {t.name: t.id for t in made}}))


def edit():
    """An edit in the admin: a new interval for "interval", to-disable switched off."""
    interval = PeriodicTask.objects.get(name="interval")
    interval.interval = every(2)
    interval.save()
    to_disable = PeriodicTask.objects.get(name="to-disable")
    to_disable.enabled = False
    to_disable.save()
    print(json.dumps({"now": timezone.now().isoformat()}))


if __name__ == "__main__":
    action = sys.argv[1]
    if action == "migrate":
        call_command("migrate", verbosity=0)
    else:
        {"setup": setup, "edit": edit}[action]()
