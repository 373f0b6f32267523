"""``python manage.py akadze COMMAND ...``: the ``akadze`` command line on the project's
``TASKS["default"]`` backend (``--alias NAME`` for another entry).

``manage.py akadze worker -q default,emails`` is ``akadze worker akadze_core.contrib.
django:app -q default,emails``; ``manage.py akadze migrate`` applies akadze's schema to the
backend's database; every other command (``jobs``, ``queues``, ``dashboard``...) runs on that
database. Everything after ``akadze`` is ``akadze``'s own options (``manage.py akadze worker
--help``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand

from .....cli.main import main
from ... import app_for


class Command(BaseCommand):
    """Run the ``akadze`` command line on a ``TASKS`` entry's queue."""

    help = ("The akadze command line on the TASKS['default'] backend's queue: "
            "`manage.py akadze worker -q QUEUES`, `manage.py akadze migrate`, "
            "`manage.py akadze jobs list`... (--alias NAME before the command for another "
            "TASKS entry).")

    def run_from_argv(self, argv: list[str]) -> None:
        """Everything after ``akadze`` goes to akadze's command line, unparsed by Django."""
        rest = list(argv[2:])
        alias = "default"
        if rest[:1] == ["--alias"] and len(rest) > 1:
            alias, rest = rest[1], rest[2:]
        if rest[:1] in (["-h"], ["--help"], []):
            print(self.help)
            return
        app_spec = ("akadze_core.contrib.django:app" if alias == "default"
                    else f"akadze_core.contrib.django:apps.{alias}")
        if rest[0] == "worker":
            rest = ["worker", app_spec, *rest[1:]]
        else:
            # The backend's database, for the commands that take no app; the worker's
            # process children (--processes) re-run the command line above instead.
            os.environ["AKADZE_DATABASE_URL"] = app_for(alias).database_url
        # What a --processes worker's children are started with (sys.argv[1:]).
        sys.argv = ["akadze", *rest]
        main(rest)

    def handle(self, *args: Any, **options: Any) -> None:
        """Unused: ``run_from_argv`` runs the command (``call_command`` is not supported)."""
        raise NotImplementedError("run `manage.py akadze ...` from the command line")
