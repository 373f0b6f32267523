"""What the web side of plainproj calls: send tasks, read results."""

from akadze_compat.result import AsyncResult

from .billing.tasks import charge, sync_ledger
from .reports.tasks import build_report, remind


def checkout(order_id, fail_times=0):
    """Charge an order in the background; returns the task id."""
    return charge.delay(order_id, fail_times=fail_times).id


def start_report(report_id, release_path):
    return build_report.apply_async(args=(report_id, release_path)).id


def sync(account):
    return sync_ledger.delay(account).id


def remind_later(message, seconds):
    return remind.apply_async((message,), countdown=seconds)


def remind_at(message, when):
    return remind.apply_async(args=[message], eta=when)


def wait_for(task_id, timeout=30.0):
    """The task's return value (its exception is raised)."""
    return AsyncResult(task_id).get(timeout=timeout)
