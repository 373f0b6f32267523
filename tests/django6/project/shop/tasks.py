"""Django tasks, defined with Django's own decorator."""

import asyncio
from datetime import timedelta

from django.tasks import task

from shop.models import Run


@task
def add(a, b):
    return a + b


@task
def fail(message):
    raise ValueError(message)


@task(takes_context=True, max_attempts=3, backoff=lambda attempt: timedelta(milliseconds=300))
def flaky(context, succeed_on):
    """Raises until its attempt ``succeed_on``."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def whoami(context, x):
    return {"id": context.task_result.id, "attempt": context.attempt, "x": x,
            "status": context.task_result.status, "workers": len(context.task_result.worker_ids)}


@task
def record(label):
    Run.objects.create(label=label)
    return label


@task(queue_name="emails")
def send(to):
    return ("sent", to)  # a tuple comes back as a list, as Django normalizes it


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task(backend="intx")
def noted(order_id):
    return order_id


@task(backend="now")
def fail_twice(message):
    raise ValueError(message)
