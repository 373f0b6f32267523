"""The Django side of tests/django6: ``python driver.py ACTION 'JSON'`` prints a JSON answer.

Runs in the interpreter with Django 6 ($DJANGO6_PYTHON); the test reads its answers and the
jobs table.
"""

import asyncio
import json
import os
import sys
import time
from datetime import timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
import django

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.tasks import task_backends  # noqa: E402
from django.tasks.exceptions import TaskResultDoesNotExist  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop import tasks  # noqa: E402
from shop.models import Order  # noqa: E402


def shown(result):
    """A TaskResult as JSON."""
    out = {"id": result.id, "status": str(result.status), "attempts": result.attempts,
           "errors": [[e.exception_class_path, e.traceback] for e in result.errors],
           "args": result.args, "kwargs": result.kwargs, "queue": result.task.queue_name,
           "priority": result.task.priority, "backend": result.backend,
           "task": result.task.module_path, "is_finished": result.is_finished}
    for name in ("enqueued_at", "started_at", "finished_at", "last_attempted_at"):
        value = getattr(result, name)
        out[name] = value.isoformat() if value else None
    run_after = result.task.run_after
    out["run_after"] = run_after.isoformat() if run_after else None
    if result.errors:
        out["exception_class"] = result.errors[0].exception_class.__name__
    if str(result.status) == "SUCCESSFUL":
        out["return_value"] = result.return_value
    return out


def outside_count(result_id):
    """Jobs with this id, seen by a connection of its own (committed rows only)."""
    with psycopg.connect(os.environ["DJTASKS_DATABASE_URL"]) as other:
        return other.execute("SELECT count(*) FROM akadze.jobs WHERE meta->>'task_id' = %s",
                             (result_id,)).fetchone()[0]


def inside_count(result_id):
    """Jobs with this id, seen by Django's connection (its transaction's own rows too)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM akadze.jobs WHERE meta->>'task_id' = %s",
                       [result_id])
        return cursor.fetchone()[0]


def missing(backend, result_id):
    try:
        task_backends[backend].get_result(result_id)
    except TaskResultDoesNotExist:
        return True
    return False


def action_migrate(_):
    call_command("migrate", run_syncdb=True, verbosity=0)
    return {}


def action_enqueue(specs):
    ids, read = [], []  # each result read back at once
    for spec in specs:
        task = getattr(tasks, spec["task"])
        changes = {}
        if "priority" in spec:
            changes["priority"] = spec["priority"]
        if "queue" in spec:
            changes["queue_name"] = spec["queue"]
        if "delay" in spec:
            changes["run_after"] = timezone.now() + timedelta(seconds=spec["delay"])
        if changes:
            task = task.using(**changes)
        result = task.enqueue(*spec.get("args", []), **spec.get("kwargs", {}))
        ids.append(result.id)
        read.append(shown(task.get_result(result.id)))
    return {"ids": ids, "results": read}


def action_results(spec):
    """The results of ``ids`` (by their task, as a caller does), once finished if
    ``wait``."""
    deadline = time.monotonic() + spec.get("wait", 0)
    while True:
        results = [getattr(tasks, name).get_result(result_id)
                   for name, result_id in spec["ids"]]
        if all(r.is_finished for r in results) or time.monotonic() > deadline:
            return {"results": [shown(r) for r in results]}
        time.sleep(0.1)


def action_transaction(spec):
    """Enqueue inside ``atomic()`` on backend ``spec["task"]``'s; count the job inside and
    outside before the block ends, and outside after it committed or rolled back."""
    task = getattr(tasks, spec["task"])
    seen = {}
    try:
        with transaction.atomic():
            Order.objects.create(email="a@example.com")
            if spec.get("savepoint"):
                try:
                    with transaction.atomic():
                        result = task.enqueue(*spec["args"])
                        raise RuntimeError("inner rollback")
                except RuntimeError:
                    pass
            else:
                result = task.enqueue(*spec["args"])
            seen["inside"] = inside_count(result.id)
            seen["outside_before_commit"] = outside_count(result.id)
            if spec.get("rollback"):
                raise RuntimeError("roll back")
    except RuntimeError:
        pass
    seen["after"] = outside_count(result.id)
    seen["orders"] = Order.objects.count()
    seen["missing"] = missing(task.backend, result.id)
    seen["id"] = result.id
    return seen


def action_async(spec):
    async def run():
        result = await tasks.async_add.aenqueue(*spec["args"])
        deadline = time.monotonic() + spec["wait"]
        while not result.is_finished and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            await result.arefresh()
        again = await tasks.async_add.aget_result(result.id)
        return {"refreshed": shown(result), "again": shown(again)}

    return asyncio.run(run())


def action_check(_):
    from akadze_core.contrib.django import AkadzeBackend

    lite = AkadzeBackend("lite", {"OPTIONS": {"DATABASE": "lite"}})
    errors = {}
    for name, options in (("bad_mode", {"ENQUEUE": "later"}), ("typo", {"MAX_ATTEMPT": 2}),
                          ("url_in_tx", {"ENQUEUE": "in_transaction", "DATABASE_URL": "x"}),
                          ("attempts", {"MAX_ATTEMPTS": 0})):
        try:
            AkadzeBackend(name, {"OPTIONS": options})
        except Exception as exc:
            errors[name] = type(exc).__name__
    return {"default": [m.id for m in task_backends["default"].check()],
            "lite": [m.id for m in lite.check()], "errors": errors}


def action_threads(_):
    """Django makes a backend per thread: they share the tasks and the akadze app."""
    import threading

    main = task_backends["default"]
    result = tasks.add.enqueue(4, 5)
    seen = {}

    def other():
        backend = task_backends["default"]
        seen["other_backend"] = backend is not main
        seen["same_app"] = backend.app is main.app
        seen["status"] = str(tasks.add.get_result(result.id).status)
        seen["enqueued"] = str(tasks.add.enqueue(1, 1).status)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return seen


def action_hostile(spec):
    """A failed job whose stored error names a module nobody imported: reading the result
    (and its exception_class) imports nothing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE akadze.jobs SET errors = '[{\"type\": \"Boom\", \"module\": \"this\", "
            "\"traceback\": \"planted\"}]'::jsonb WHERE meta->>'task_id' = %s", [spec["id"]])
    error = tasks.fail.get_result(spec["id"]).errors[0]
    try:
        raised = error.exception_class.__name__
    except ValueError as exc:
        raised = type(exc).__name__
    return {"path": error.exception_class_path, "raised": raised,
            "imported": "this" in sys.modules}


def action_unknown(spec):
    return {"missing": missing("default", spec["id"])}


if __name__ == "__main__":
    action, argument = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
    print(json.dumps(globals()[f"action_{action}"](argument)))
