"""Operator scripts: never imported by the worker, so only the doctor's scan sees them."""

from akadze_compat.contrib.abortable import AbortableTask
from akadze_compat.result import GroupResult
from legacyproj.celery import app


class CancellableExport(AbortableTask):
    def run(self, export_id):
        return export_id


def restore_batch(group_id):
    return GroupResult.restore(group_id, app=app)


def stop_everything():
    app.control.autoscale(10, 3)
