"""Which Celery beat schedulers (``beat_scheduler``, ``--scheduler``) akadze honours.

Private to ``akadze_compat``; at the bottom of the package (it imports none of it), so that
``beat``, ``support`` (the doctor's claims) and the commands read the same constant.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HONOURED_SCHEDULERS", "scheduler_name", "unhonoured_scheduler"]

#: The ``beat_scheduler`` values (``module:Class``; ``module.Class`` is read the same) whose
#: schedules run here. Celery's default keeps its schedules in ``beat_schedule``, which every
#: worker runs; django_celery_beat's ``DatabaseScheduler`` has its tables read by every
#: worker. The one place to add a scheduler akadze learns to honour; any other value draws
#: :func:`unhonoured_scheduler`'s line.
HONOURED_SCHEDULERS: frozenset[str] = frozenset({
    "celery.beat:PersistentScheduler",
    "akadze_compat.beat:PersistentScheduler",  # the setting with its imports renamed
    # django_celery_beat's tables, read by every worker (akadze_compat.django_beat).
    "django_celery_beat.schedulers:DatabaseScheduler",
    "django",  # its entry-point name
})
#: What the schedulers projects use most keep elsewhere, by top-level package.
_KEPT_ELSEWHERE = {
    "django_celery_beat": "the periodic tasks in django_celery_beat's database tables "
                          "(PeriodicTask rows, the Django admin's)",
    "redbeat": "the schedules RedBeat keeps in Redis",
}

#: What to do instead, for the schedulers that have a way over.
_WAY_OVER = {
    "redbeat": "; `akadze-compat import-redbeat` copies them into akadze's schedules once",
}


def scheduler_name(value: Any) -> str:
    """``module:Class`` for a scheduler given as text (either spelling) or as a class."""
    if isinstance(value, type):
        return f"{value.__module__}:{value.__qualname__}"
    text = str(value).strip()
    if ":" not in text and "." in text:
        module, _, name = text.rpartition(".")
        text = f"{module}:{name}"
    return text


def unhonoured_scheduler(value: Any, where: str = "beat_scheduler") -> str | None:
    """The one line saying which schedules will not run when ``value`` (set by ``where``)
    is a scheduler not honoured here; None for an honoured one or none."""
    if not value:
        return None
    name = scheduler_name(value)
    if name in HONOURED_SCHEDULERS:
        return None
    package = name.split(":")[0].split(".")[0]
    kept = _KEPT_ELSEWHERE.get(package, f"the schedules {name} keeps or computes")
    return (f"{where} {name} is not supported: {kept} will not run; only beat_schedule "
            'and add_periodic_task entries do (migration_guide/celery.md, "Beat runs inside '
            f'the workers"){_WAY_OVER.get(package, "")}')
