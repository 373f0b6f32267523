"""``celery.worker.control``: remote control commands (not provided).

Workers take no broadcast commands: ``revoke`` is a database write (``app.control.revoke``),
and ``akadze-compat inspect`` / ``status`` read the database.
"""

from __future__ import annotations

from ..utils.unsupported import not_provided

__all__: list[str] = []

_NO_BROADCAST = ("workers take no remote control commands (no broadcast); revoke with "
                 "app.control.revoke, look with `akadze-compat inspect` / `status`")
__getattr__ = not_provided(__name__, {
    name: (_NO_BROADCAST, "0-what-does-not-come-along")
    for name in ("Panel", "control_command", "inspect_command")})
