"""Tasks of the shop app, found by app.autodiscover_tasks() through INSTALLED_APPS."""

import os

from django.conf import settings

from akadze_compat import shared_task


@shared_task
def send_receipt(order_id, email):
    return f"receipt for order {order_id} sent to {email}"


@shared_task(bind=True)
def process_order(self, order_id):
    return {"order": order_id, "queue": self.request.delivery_info["queue"],
            "time_zone": settings.TIME_ZONE, "pid": os.getpid()}
