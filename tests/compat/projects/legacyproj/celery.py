"""The app of legacyproj and its signal receivers."""

from akadze_compat import Celery
from akadze_compat.signals import heartbeat_sent, task_prerun, task_received

app = Celery("legacyproj")
app.config_from_object("legacyproj.celeryconfig")
app.autodiscover_tasks(["legacyproj.orders"])

received = []


@task_received.connect
def count_received(sender=None, request=None, **kwargs):
    received.append(request)


@heartbeat_sent.connect
def touch_health_file(sender=None, **kwargs):
    with open("/tmp/legacyproj-alive", "w"):
        pass


@task_prerun.connect
def log_start(sender=None, task_id=None, **kwargs):
    pass
