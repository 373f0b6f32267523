from akadze_compat import shared_task

from .celery import app


@shared_task
def add(x, y):
    return x + y


@shared_task
def boom():
    raise ValueError("boom")


@shared_task(bind=True, max_retries=3, default_retry_delay=0)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(countdown=0)
    return self.request.retries


@app.task
def send_report(order_id):
    return {"order": order_id, "status": "sent"}
