"""Switch the celery alias on: ``import akadze_compat.as_celery`` as a program's first line
makes ``import celery``, every ``celery.<sub>`` and the ``billiard`` names Celery's add-ons
use resolve to akadze_compat, for this process and the processes it starts.

The same switch, without touching code: ``AKADZE_CELERY=1`` in the environment (read at
interpreter start), or the ``akadze-compat`` command (on unless ``AKADZE_CELERY=0``). See
``akadze_compat._alias`` for how it works and ``migration_guide/third-party.md`` for what it
is for.
"""

from __future__ import annotations

from ._alias import ENV_VAR, AliasFinder, disabled_by_env, enabled_by_env, install, installed

__all__ = ["ENV_VAR", "AliasFinder", "disabled_by_env", "enabled_by_env", "install",
           "installed"]

install()
