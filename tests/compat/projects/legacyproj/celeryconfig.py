"""Settings of legacyproj, with Celery's pre-4.0 upper-case names."""

import os

from akadze_compat.schedules import crontab

BROKER_URL = os.environ.get("LEGACYPROJ_BROKER_URL", "postgresql://localhost/legacyproj")
CELERY_RESULT_BACKEND = "redis://:legacy-s3cret@localhost:6379/0"
CELERY_ACCEPT_CONTENT = ["pickle", "json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TIMEZONE = "Europe/London"
CELERY_ROUTES = {"legacyproj.orders.tasks.*": {"queue": "orders"}}
CELERY_ANNOTATIONS = {"legacyproj.orders.tasks.fetch_rates": {"rate_limit": "10/s"}}
CELERYD_PREFETCH_MULTIPLIER = 1
CELERYD_MAX_MEMORY_PER_CHILD = 200_000
# A typo: Celery ignores it too, silently.
CELERY_TASK_ACK_LATE = True

CELERYBEAT_SCHEDULE = {
    "nightly-report": {
        "task": "legacyproj.orders.tasks.nightly_report",
        "schedule": crontab(hour=3, minute=0),
        "options": {"countdown": 10},
    },
}
