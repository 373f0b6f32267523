"""Django settings of the django.tasks test project: the queue in Django's own database.

Three backends, one per way of enqueueing: ``default`` sends after the commit, ``intx``
inserts inside Django's transaction, ``now`` sends at once.
"""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("DJTASKS_DATABASE_URL", "dbname=djtasks"))

SECRET_KEY = "djtasks-test-only-not-a-secret"
DEBUG = False
INSTALLED_APPS = ["shop", "akadze_core.contrib.django"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    },
    # Not Postgres: a backend pointed at it fails Django's system check (akadze.E001).
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

TASKS = {
    "default": {
        "BACKEND": "akadze_core.contrib.django.AkadzeBackend",
        "QUEUES": ["default", "emails"],
    },
    "intx": {
        "BACKEND": "akadze_core.contrib.django.AkadzeBackend",
        "OPTIONS": {"ENQUEUE": "in_transaction"},
    },
    "now": {
        "BACKEND": "akadze_core.contrib.django.AkadzeBackend",
        "OPTIONS": {"ENQUEUE": "now", "MAX_ATTEMPTS": 2},
    },
}
