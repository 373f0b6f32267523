"""Django settings of djbeatproj: django_celery_beat on Postgres, the queue in the same database.

The Django side (migrations, the ORM, the admin) has django_celery_beat installed; the akadze
workers do not need it (nor Celery): they read its tables with SQL. So it is installed here
only where it can be imported.
"""

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

DATABASE_URL = os.environ.get("DJBEATPROJ_DATABASE_URL", "postgresql://localhost/djbeatproj")
_db = conninfo_to_dict(DATABASE_URL)

SECRET_KEY = "djbeatproj-test-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["reports"]
if importlib.util.find_spec("django_celery_beat") is not None:
    INSTALLED_APPS.append("django_celery_beat")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = DATABASE_URL
CELERY_TIMEZONE = TIME_ZONE
