"""akadze_compat's layers point down: read from the source (``tests/package_structure.py``).

Bottom to top; a module imports (when it is imported) only from its own layer or those below,
never from a function body (a late import is a cycle hidden from import time), and never
another module's private attributes. Imports under ``if TYPE_CHECKING:`` are free: they do not
run. A new module must be given a layer here (docs/reference/layout.md says the same in words).

Below the facade, the core: akadze_compat imports ``akadze_core``'s public names and the one
module written for frameworks built on it, ``akadze_core.integration``, and no other core
module, wherever the import stands (``test_the_facade_reaches_the_core_only_...``).

The core has layers too, one subpackage each (``CORE_LAYERS``), and there every import
counts: under ``if TYPE_CHECKING:`` and inside functions as well, so that a room never even
names one above it (``tests/unit/test_core_circles.py`` holds the same graph free of
circles).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from tests import package_structure

#: Layer name -> module patterns (fnmatch on the dotted name without ``akadze_compat.``).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Celery's import paths that are pure data or process state: no app, no database.
    ("base", ("_state", "_schedulers", "_triggers", "exceptions", "states", "signals",
              "serialization", "schedules", "bootsteps", "utils", "utils.*", "platforms",
              "registry", "_alias")),
    # Settings and what is read from them.
    ("settings", ("app.defaults", "app.config", "app.routes", "app.context", "loaders",
                  "app.annotations")),
    # The client side: sending tasks, reading results, revoking.
    ("client", ("backends", "backends.*", "app.backends", "result", "canvas", "canvas.*",
                "app.amqp",
                "app.flow", "app.publish", "app.control")),
    # Running one task call: the tracer, eager runs, the worker's entry and time limits.
    ("run", ("app.trace", "app.eager", "app.autoretry", "app.replace", "worker", "worker.canvas",
             "worker.entry", "worker.timelimits", "worker.request")),
    # The app and its tasks, which compose everything below.
    ("app", ("app", "app.task", "app.registry", "app.validation", "app.base", "app.builtins",
             "app.report",
             "app.command",
             "beat", "_beat_scheduler",
             "django_beat",
             "redbeat_import",
             "contrib.abortable",
             "contrib.django", "contrib.django.*")),
    # Processes and tools: the command, the doctor, Celery's worker-side paths, the package.
    ("tools", ("", "__main__", "cli", "bin", "bin.*", "doctor", "doctor_scan", "support", "addons",
               "worker.pool", "worker.control", "contrib", "contrib.*", "as_celery",
               "_billiard", "_billiard.*", "flower_api")),
]

#: akadze_core's layers, bottom to top: subpackage (or top-level module) patterns, on the
#: dotted name without ``akadze_core.``; an import may point down or sideways, never up.
CORE_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # What a job is and the pure rules about it: no connection, nothing else of the core.
    ("model", ("model", "model.*")),
    # The SQL room: statements, connections, migrations, LISTEN, lookups.
    ("store", ("store", "store.*")),
    ("schedules", ("schedules", "schedules.*")),
    ("enqueue", ("enqueue", "enqueue.*")),
    # The App composes the rooms below; it names none above it.
    ("app", ("app",)),
    # What takes an App: control of jobs and workers, metrics.
    ("ops", ("ops", "ops.*")),
    ("execution", ("execution", "execution.*")),
    ("worker", ("worker", "worker.*")),
    ("dashboard", ("dashboard", "dashboard.*")),
    ("cli", ("cli", "cli.*")),
    # The package's face and the facade's door.
    ("face", ("", "integration")),
    # Integrations with other frameworks (Django's task framework), which import those.
    ("contrib", ("contrib", "contrib.*")),
]

#: ``obj._x`` accesses that are Celery's own protocols, not another module's internals:
#: ``Task._get_exec_options`` is the hook Celery's senders call (a subclass may override it),
#: ``_get_current_object`` is how Celery's signals unwrap a Proxy, ``Inspect._request`` is
#: how Celery's ``inspect`` command (and projects) ask for a custom inspect command.
ALLOWED_PRIVATE = frozenset({"_get_exec_options", "_get_current_object", "_request"})

PREFIX = package_structure.PACKAGE + "."


def layer_of(module: str) -> int:
    name = "" if module == package_structure.PACKAGE else module.removeprefix(PREFIX)
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"{module} has no layer in tests/unit/test_layers.py (LAYERS)")


def test_every_module_has_a_layer() -> None:
    for module in package_structure.load():
        layer_of(module)


def test_imports_point_down_or_sideways() -> None:
    modules = package_structure.load()
    upward = []
    for module in modules.values():
        for item in module.imports:
            if item.type_checking or item.in_function or item.target == module.name:
                continue
            if layer_of(item.target) > layer_of(module.name):
                upward.append(f"{module.name}:{item.line} ({LAYERS[layer_of(module.name)][0]}) "
                              f"imports {item.target} ({LAYERS[layer_of(item.target)][0]})")
    assert upward == []


def test_no_import_cycles() -> None:
    modules = package_structure.load()
    assert package_structure.cycles(package_structure.module_graph(modules)) == []
    # Nor any once the imports inside functions count (there are none, see below).
    assert package_structure.cycles(
        package_structure.module_graph(modules, in_functions=True)) == []


def test_no_imports_of_the_package_inside_functions() -> None:
    found = [f"{item.source}:{item.line} -> {item.target}"
             for item in package_structure.function_imports(package_structure.load())]
    assert found == []


def test_no_module_touches_another_modules_private_attributes() -> None:
    found = [f"{module}:{line} {text}"
             for module, line, text in package_structure.private_accesses(
                 package_structure.load())
             if text.rpartition(".")[2] not in ALLOWED_PRIVATE]
    assert found == []
    assert package_structure.private_imports(package_structure.load()) == []


def test_the_facade_reaches_the_core_only_through_its_public_names_and_integration() -> None:
    """akadze_compat imports ``akadze_core`` (its public names) and
    ``akadze_core.integration``, nothing else of the core: not at import time, not inside a
    function, not under ``if TYPE_CHECKING:``."""
    allowed = {package_structure.CORE, package_structure.CORE_INTEGRATION}
    found = [f"{item.source}:{item.line} imports {item.target}"
             for item in package_structure.core_imports(package_structure.load())
             if item.target not in allowed]
    assert found == []


def test_the_core_scan_sees_every_spelling_of_a_core_submodule_import(tmp_path: Path) -> None:
    """The boundary check can fail: each way of reaching a core submodule is caught."""
    (tmp_path / "akadze_core").mkdir()
    for name in ("__init__", "integration", "database", "outcomes"):
        (tmp_path / "akadze_core" / f"{name}.py").write_text("")
    package = tmp_path / package_structure.PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from akadze_core import App, integration\n"
        "from akadze_core.integration import outcome_of\n"
        "from akadze_core import database\n"
        "import akadze_core.outcomes\n"
        "if TYPE_CHECKING:\n    from akadze_core.database import JobRequest\n"
        "def late():\n    from akadze_core.outcomes import Outcome\n")
    found = [(item.line, item.target, item.in_function, item.type_checking)
             for item in package_structure.core_imports(package_structure.load(tmp_path),
                                                        tmp_path)]
    assert found == [
        (2, "akadze_core", False, False), (2, "akadze_core.integration", False, False),
        (3, "akadze_core.integration", False, False), (4, "akadze_core.database", False, False),
        (5, "akadze_core.outcomes", False, False), (7, "akadze_core.database", False, True),
        (9, "akadze_core.outcomes", True, False)]


def test_the_scan_sees_an_upward_import_a_late_import_and_a_private_access(
        tmp_path: Path) -> None:
    """The checks can fail: a small package with each fault is caught by the same scan."""
    root = tmp_path
    package = root / package_structure.PACKAGE
    (package / "app").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "app" / "__init__.py").write_text("")
    (package / "states.py").write_text("from .app import base\n")
    (package / "app" / "base.py").write_text(
        "class Celery:\n    def __init__(self):\n        self._tasks = {}\n\n"
        "def late():\n    from .. import states\n")
    (package / "result.py").write_text("def read(app):\n    return app._tasks\n")
    modules = package_structure.load(root)
    graph = package_structure.module_graph(modules)
    assert "akadze_compat.app.base" in graph["akadze_compat.states"]
    assert layer_of("akadze_compat.app.base") > layer_of("akadze_compat.states")
    assert [i.target for i in package_structure.function_imports(modules)] == [
        "akadze_compat.states"]
    assert package_structure.private_accesses(modules) == [
        ("akadze_compat.result", 2, "app._tasks")]
    assert package_structure.cycles(package_structure.module_graph(
        modules, in_functions=True)) == [["akadze_compat.app.base", "akadze_compat.states"]]


def core_layer_of(module: str) -> int:
    name = "" if module == package_structure.CORE else module.removeprefix(
        package_structure.CORE + ".")
    for index, (_, patterns) in enumerate(CORE_LAYERS):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"{module} has no layer in tests/unit/test_layers.py (CORE_LAYERS)")


def core_upward_imports(root: Path = package_structure.ROOT) -> list[str]:
    """Every import of an akadze_core module from a lower layer, wherever it stands."""
    modules = package_structure.load(root, package=package_structure.CORE)
    found = []
    for module in modules.values():
        for item in module.imports:
            if core_layer_of(item.target) > core_layer_of(module.name):
                found.append(
                    f"{module.name}:{item.line} ({CORE_LAYERS[core_layer_of(module.name)][0]}) "
                    f"imports {item.target} ({CORE_LAYERS[core_layer_of(item.target)][0]})")
    return found


def test_every_core_module_has_a_layer() -> None:
    for module in package_structure.load(package=package_structure.CORE):
        core_layer_of(module)


def test_core_imports_point_down_or_sideways() -> None:
    assert core_upward_imports() == []


def test_the_core_scan_sees_an_upward_import_even_for_the_type_checker(
        tmp_path: Path) -> None:
    """The core's check can fail: the store naming the worker, at import time, inside a
    function or only for the type checker, is caught each time."""
    core = tmp_path / package_structure.CORE
    for folder in ("model", "store", "worker"):
        (core / folder).mkdir(parents=True)
        (core / folder / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "model" / "jobs.py").write_text("")
    (core / "worker" / "runs.py").write_text("from ..model import jobs\n")
    (core / "store" / "database.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..worker import runs\n"
        "if TYPE_CHECKING:\n    from ..worker.runs import Runs\n"
        "def late():\n    from ..worker import runs\n")
    assert core_upward_imports(tmp_path) == [
        f"akadze_core.store.database:{line} (store) imports akadze_core.worker.runs (worker)"
        for line in (2, 4, 6)]
