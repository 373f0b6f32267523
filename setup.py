"""Build hooks the declarative configuration cannot express: ``pyproject.toml`` has the rest.

The package installs one file beside itself in site-packages, ``akadze-celery.pth``: Python
runs its line at every interpreter start, and that line switches the celery alias on
(``akadze_compat.as_celery``) when ``AKADZE_CELERY`` asks for it, and does nothing otherwise.
A ``.pth`` file must sit at the top of site-packages, where no package data goes, so it is
added to the build by hand: to the regular wheel's build directory, and to the editable
wheel's contents for ``pip install -e``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "akadze-celery.pth"
# Cheap when the variable is unset: one dictionary look-up, no import of akadze.
PTH_LINE = ('import os; os.environ.get("AKADZE_CELERY", "").strip().lower() in '
            '("1", "true", "yes", "on") and __import__("akadze_compat.as_celery")\n')


def _write_pth(directory: str) -> str:
    path = Path(directory, PTH_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PTH_LINE, encoding="utf-8")
    return os.fspath(path)


class BuildPyWithPth(build_py):
    """build_py that also puts the ``.pth`` file at the top of the wheel."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            _write_pth(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


class EditableWheelWithPth(editable_wheel):
    """editable_wheel that also puts the ``.pth`` file at the top of the editable wheel
    (its files are the unpacked directory's, written after the build commands run)."""

    def _run_build_commands(self, dist_name: str, unpacked_wheel: str, *args: Any,
                            **kwargs: Any) -> Any:
        result = super()._run_build_commands(dist_name, unpacked_wheel, *args, **kwargs)
        _write_pth(unpacked_wheel)
        return result


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
