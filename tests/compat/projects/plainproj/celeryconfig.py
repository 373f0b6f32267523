"""Settings of plainproj (Celery's lower-case names)."""

import os

from kombu import Queue

# The worker gets the URL from -b or CELERY_BROKER_URL; this is the development default.
broker_url = os.environ.get("PLAINPROJ_BROKER_URL", "postgresql://localhost/plainproj")
# Accepted and ignored by akadze_compat: results live in the queue's database.
result_backend = os.environ.get("PLAINPROJ_RESULT_BACKEND", "redis://localhost:6379/1")

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
timezone = "Europe/Berlin"
enable_utc = True

task_default_queue = "celery"
task_queues = (Queue("celery"), Queue("hipri"), Queue("lopri"))
task_routes = {
    "plainproj.billing.tasks.charge": {"queue": "hipri"},
    "plainproj.reports.tasks.*": {"queue": "lopri"},
}
task_track_started = True
result_expires = 3600
worker_prefetch_multiplier = 1
# The tests switch it off to see Celery's early-acknowledgement prefetch window.
task_acks_late = os.environ.get("PLAINPROJ_ACKS_LATE", "1") == "1"
