"""Tasks of the reports app, found by app.autodiscover_tasks() through INSTALLED_APPS."""

from akadze_compat import shared_task


@shared_task(bind=True)
def record(self, label, **extra):
    return {"label": label, "extra": extra, "queue": self.request.delivery_info["queue"]}
