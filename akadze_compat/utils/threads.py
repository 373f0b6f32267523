"""``celery.utils.threads``: the thread helpers projects import (the rest is not provided)."""

from __future__ import annotations

import threading

from .unsupported import not_provided

__all__ = ["Local", "get_ident"]

#: The current thread's identifier (``threading.get_ident``).
get_ident = threading.get_ident


class Local(threading.local):
    """Attributes private to each thread (``threading.local``)."""


__getattr__ = not_provided(__name__, {
    name: ("the worker's threads are akadze_core's; use threading / contextvars directly",
           "0-what-does-not-come-along")
    for name in ("bgThread", "LocalStack", "LocalManager", "default_socket_timeout",
                 "bound_open_broker_sockets")})
