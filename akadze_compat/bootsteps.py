"""``celery.bootsteps``: custom worker boot steps (not provided).

The worker's parts are akadze_core's and take no plug-ins; the ``worker_init``,
``worker_ready``, ``worker_process_init`` and ``worker_shutdown`` signals run code at those
points instead.
"""

from __future__ import annotations

from .utils.unsupported import not_provided

__all__: list[str] = []

_NO_BOOTSTEPS = ("custom worker bootsteps are not supported: connect to the worker_init / "
                 "worker_ready / worker_process_init / worker_shutdown signals")
__getattr__ = not_provided(__name__, {
    name: (_NO_BOOTSTEPS, "signals")
    for name in ("Blueprint", "Step", "StartStopStep", "ConsumerStep")})
