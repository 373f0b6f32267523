"""Django settings of djangoproj: just enough Django, and Celery's CELERY_ settings."""

import os

SECRET_KEY = "djangoproj-test-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "shop.apps.ShopConfig",
]
# The shop keeps no tables of its own: no database here beyond the queue's.
DATABASES = {}
USE_TZ = True
TIME_ZONE = "Europe/Paris"

CELERY_BROKER_URL = os.environ.get("DJANGOPROJ_DATABASE_URL",
                                   "postgresql://localhost/djangoproj")
CELERY_RESULT_BACKEND = "django-db"
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_DEFAULT_QUEUE = "django"
CELERY_TASK_ROUTES = {
    "shop.tasks.process_order": {"queue": "orders"},
}
CELERY_TASK_TRACK_STARTED = True
CELERY_TASK_TIME_LIMIT = 30 * 60
CELERY_WORKER_CONCURRENCY = 2

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "djangoproj-log %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
