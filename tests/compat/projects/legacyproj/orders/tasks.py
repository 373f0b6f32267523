"""Order tasks, with the options and canvas an old Celery project uses."""

from akadze_compat import chain, group, shared_task
from legacyproj.celery import app


@shared_task(rate_limit="10/m", acks_late=True, reject_on_worker_lost=True)
def fetch_rates(currency):
    return {"currency": currency, "rate": 1.0}


@app.task(bind=True, time_limit=30, soft_time_limit=20, priority=9)
def settle(self, order_id):
    if self.request.delivery_info.get("redelivered"):
        return {"order": order_id, "again": True}
    return {"order": order_id}


@app.task(time_limit=10)
async def notify(order_id):
    return order_id


@app.task(serializer="pickle")
def archive(order):
    return order


@app.task
def nightly_report():
    return "done"


def settle_all(order_ids):
    return group(settle.s(order_id) for order_id in order_ids).apply_async()


def rates_then_settle(order_id):
    return (fetch_rates.s("EUR") | settle.si(order_id)).delay()


def settle_in_order(order_ids):
    return chain(*(settle.si(order_id) for order_id in order_ids))()


def busy_workers():
    return app.control.inspect().active()
