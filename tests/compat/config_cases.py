"""Configuration sources shared by our tests and the differential run against Celery.

Plain Python (no akadze, no pytest), importable by the Celery interpreter too.
"""

# ruff: noqa: RUF012 - these classes stand for settings modules: plain attributes on purpose

from __future__ import annotations

from datetime import timedelta


class NewStyle:
    task_always_eager = True
    task_default_queue = "default"
    worker_concurrency = 8
    task_routes = {"feed.*": {"queue": "feeds"}}
    task_serializer = "json"
    result_expires = 3600
    task_time_limit = 30


class OldStyle:
    CELERY_ALWAYS_EAGER = True
    CELERY_DEFAULT_QUEUE = "legacy"
    CELERYD_CONCURRENCY = 3
    CELERY_ROUTES = {"a.b": "q"}
    BROKER_URL = "postgresql://localhost/old"
    CELERY_TASK_SERIALIZER = "json"
    CELERY_TASK_RESULT_EXPIRES = timedelta(hours=2)
    CELERY_EAGER_PROPAGATES_EXCEPTIONS = True
    CELERYD_TASK_TIME_LIMIT = 60
    CELERY_TIMEZONE = "Europe/Paris"


class DjangoStyle:
    """A Django settings module read with namespace="CELERY"."""

    TIME_ZONE = "America/New_York"
    CELERY_TASK_ALWAYS_EAGER = True
    CELERY_BROKER_URL = "postgresql://localhost/django"
    CELERY_TASK_DEFAULT_QUEUE = "django"
    CELERY_WORKER_CONCURRENCY = 5
    CELERY_TASK_ROUTES = {"x": "y"}
    CELERY_RESULT_EXPIRES = 60
    CELERY_TASK_EAGER_PROPAGATES = True


class DjangoOldNames:
    """Old setting names in a Django settings module with namespace="CELERY"."""

    CELERY_ALWAYS_EAGER = True
    CELERY_ROUTES = {"x": "old"}
    CELERYD_CONCURRENCY = 2
    CELERY_DEFAULT_QUEUE = "dq"


KEYS = ["task_always_eager", "task_default_queue", "worker_concurrency", "task_routes",
        "broker_url", "task_serializer", "result_expires", "task_eager_propagates",
        "task_time_limit", "timezone", "worker_prefetch_multiplier", "task_acks_late",
        "accept_content", "task_create_missing_queues", "enable_utc"]

#: (source class name, namespace)
SCENARIOS = [("NewStyle", None), ("OldStyle", None), ("DjangoStyle", "CELERY"),
             ("DjangoOldNames", "CELERY")]
