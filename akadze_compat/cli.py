"""``akadze_compat.cli``: where the ``akadze-compat`` command lived; it is ``akadze_compat.bin``.

Kept because the docs and ``bench/`` name it (``from akadze_compat.cli import main``).
"""

from .bin.celery import cli, main

__all__ = ["cli", "main"]
