"""The Celery app: ``akadze-compat -A examples.celery_project worker`` finds it here.

No broker URL is set, so the app uses ``$AKADZE_DATABASE_URL`` (or ``broker_url`` /
``CELERY_BROKER_URL`` when you set one), and without any of them the embedded Postgres of
the project (``.akadze/`` of the repository root, or ``$AKADZE_HOME``).
"""

from akadze_compat import Celery

app = Celery("celery_project", include=["examples.celery_project.tasks"])
app.conf.update(
    task_default_queue="celery",
    # Results live in the queue's own database: no result_backend is needed (one set is
    # accepted and ignored).
    result_expires=3600,
    beat_schedule={
        # Every worker enqueues the due runs itself, exactly once per tick: no beat process.
        "heartbeat-every-2s": {
            "task": "examples.celery_project.tasks.heartbeat",
            "schedule": 2.0,
            "args": ("beat",),
        },
    },
)
