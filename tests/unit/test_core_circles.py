"""The App and the rooms it composes import in one direction, even for the type checker.

Tasks, workflows and schedules reach the database through ``akadze_core.store.connections`` and
describe what they need of the app as small protocols (``TaskHost``, ``WorkflowHost``,
``ScheduleHost``), so none of them imports ``akadze_core.app``: no import circle through them,
counting imports under ``if TYPE_CHECKING:`` and inside functions (read with ``ast`` by
``tests/package_structure.py``).
"""

from __future__ import annotations

from tests import package_structure

#: Modules that must sit in no import circle of akadze_core.
ACYCLIC = ("app", "store.connections", "enqueue.tasks", "enqueue.workflow", "schedules.scheduler",
           "schedules.runtime")


def test_app_and_its_rooms_are_in_no_import_circle() -> None:
    modules = package_structure.load(package="akadze_core")
    graph = package_structure.module_graph(modules, in_functions=True, type_checking=True)
    circles = package_structure.cycles(graph)
    caught = [circle for circle in circles
              if any(f"akadze_core.{name}" in circle for name in ACYCLIC)]
    assert caught == []


def test_the_connection_room_imports_nothing_above_it() -> None:
    modules = package_structure.load(package="akadze_core")
    graph = package_structure.module_graph(modules, in_functions=True, type_checking=True)
    above = {"akadze_core.app", "akadze_core.enqueue.tasks", "akadze_core.enqueue.workflow",
             "akadze_core.schedules.scheduler", "akadze_core.schedules.runtime",
             "akadze_core.worker.lifecycle"}
    assert graph["akadze_core.store.connections"] & above == set()
