"""The tasks: plain, bound with retry, autoretry with backoff, and one that gives up."""

from __future__ import annotations

from akadze_compat import shared_task
from akadze_compat.utils.log import get_task_logger

logger = get_task_logger(__name__)


class VendorDown(ConnectionError):
    """The pretend vendor is unavailable."""


@shared_task
def add(x: int, y: int) -> int:
    return x + y


@shared_task(bind=True, max_retries=5, default_retry_delay=1)
def fetch_rate(self, currency: str) -> dict:
    """Fails on its first two runs and retries itself with ``self.retry``."""
    if self.request.retries < 2:
        logger.info("fetch_rate(%s): vendor down, retry %d", currency, self.request.retries + 1)
        raise self.retry(exc=VendorDown("rates API unavailable"), countdown=1)
    return {"currency": currency, "rate": 1.08, "retries": self.request.retries}


@shared_task(bind=True, autoretry_for=(VendorDown,), retry_backoff=True, retry_jitter=False,
             max_retries=3)
def sync_crm(self, customer_id: int) -> str:
    """Raises VendorDown twice; autoretry_for retries after 1 s, then 2 s (backoff)."""
    if self.request.retries < 2:
        raise VendorDown(f"CRM unavailable (run {self.request.retries + 1})")
    return f"customer {customer_id} synced after {self.request.retries} retries"


@shared_task(bind=True, autoretry_for=(VendorDown,), max_retries=1,
             retry_kwargs={"countdown": 0.5})
def always_down(self) -> None:
    """Never succeeds: after max_retries the last exception is the task's failure."""
    raise VendorDown("the vendor is gone for good")


@shared_task
def heartbeat(source: str) -> str:
    return f"heartbeat from {source}"
