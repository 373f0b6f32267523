"""Billing tasks: written with @shared_task, as reusable apps do."""

from akadze_compat import shared_task
from akadze_compat.utils.log import get_task_logger

logger = get_task_logger(__name__)


class PaymentGatewayTimeout(Exception):
    """The payment provider did not answer in time."""


class LedgerUnavailable(ConnectionError):
    """The ledger service refused the connection."""


@shared_task
def add(x, y):
    return x + y


@shared_task(bind=True, max_retries=5, default_retry_delay=30)
def charge(self, order_id, fail_times=0):
    """Fails ``fail_times`` times with a gateway timeout, retrying quickly, then succeeds."""
    if self.request.retries < fail_times:
        logger.info("charging order %s: gateway timeout, retrying", order_id)
        raise self.retry(exc=PaymentGatewayTimeout(f"order {order_id}"), countdown=0.2)
    return {"order": order_id, "retries": self.request.retries,
            "queue": self.request.delivery_info["queue"], "hostname": self.request.hostname}


@shared_task(autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=2)
def sync_ledger(account):
    """The ledger is down for good: retried with backoff, then FAILURE."""
    raise LedgerUnavailable(f"ledger unreachable for {account}")
