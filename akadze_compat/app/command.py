"""``Celery.start`` and ``Celery.worker_main``: the ``akadze-compat`` command line for one app.

The command runs as ``python -m akadze_compat -A module:attribute ...``, the app named by
the module that holds it, as a prefork child finds it. A script run as ``python tasks.py``
is the module ``tasks`` there (its directory goes on ``PYTHONPATH``): Celery's tutorial
ends with ``if __name__ == "__main__": app.start()``, and ``python tasks.py worker`` then
is ``akadze-compat -A tasks:app worker``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["command_line", "start"]


def _holder(app: Any) -> tuple[str, str, Any] | None:
    """(module name, attribute, module) of a module that holds ``app``; ``__main__`` last,
    akadze's own modules (which hold the current app) never."""
    modules = sorted(sys.modules.items(), key=lambda item: item[0] == "__main__")
    for name, module in modules:
        if name.startswith(("akadze_", "_")) and name != "__main__":
            continue
        try:
            attributes = list(vars(module).items())
        except TypeError:
            continue  # a stand-in without a __dict__
        for attribute, value in attributes:
            if value is app:
                return name, attribute, module
    return None


def command_line(app: Any, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command (and its environment) that runs ``akadze-compat <argv>`` for ``app``.
    RuntimeError when no importable module holds the app."""
    found = _holder(app)
    env = dict(os.environ)
    spec = None
    if found is not None:
        name, attribute, module = found
        module_spec = getattr(module, "__spec__", None)
        path = getattr(module, "__file__", None)
        if name != "__main__":
            spec = f"{name}:{attribute}"
        elif module_spec is not None and module_spec.name != "__main__":
            spec = f"{module_spec.name}:{attribute}"  # python -m proj.tasks
        elif path:
            script = Path(path).resolve()
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(script.parent),
                                                              env.get("PYTHONPATH")]))
            spec = f"{script.stem}:{attribute}"
    if spec is None:
        raise RuntimeError(f"app.start() runs the command in a new process, which finds the "
                           f"app by its module: define {app!r} at the top level of a module, "
                           "or run `akadze-compat -A module:attribute ...`")
    return [sys.executable, "-m", "akadze_compat", "-A", spec, *argv], env


def start(app: Any, argv: Sequence[str] | None) -> None:
    """``argv`` None (a script's ``app.start()``): this process becomes the command, with the
    script's arguments. Else the command runs to its end; a failure raises ``SystemExit``
    with its exit code, as the command exits."""
    command, env = command_line(app, sys.argv[1:] if argv is None else argv)
    if argv is None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.execve(sys.executable, command, env)
    code = subprocess.run(command, env=env, check=False).returncode
    if code:
        raise SystemExit(code)
