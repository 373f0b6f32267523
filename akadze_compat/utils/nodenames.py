"""Worker node names (Celery's ``celery.utils.nodenames``): ``name@host``.

Celery's own test suites name the embedded worker with ``anon_nodename()`` and look for
the replies of ``inspect()`` under that name.
"""

from __future__ import annotations

import os
import socket

__all__ = ["NODENAME_DEFAULT", "NODENAME_SEP", "anon_nodename", "default_nodename",
           "gethostname", "nodename", "nodesplit"]

NODENAME_SEP = "@"
NODENAME_DEFAULT = "celery"


def gethostname() -> str:
    """This machine's host name."""
    return socket.gethostname()


def nodename(name: str, hostname: str) -> str:
    """``name@hostname``."""
    return NODENAME_SEP.join((name, hostname))


def anon_nodename(hostname: str | None = None, prefix: str = "gen") -> str:
    """The name of a worker given none: ``gen<pid>@<host>``."""
    return nodename(f"{prefix}{os.getpid()}", hostname or gethostname())


def nodesplit(name: str) -> tuple[None, str] | tuple[str, str]:
    """``(name, host)`` of ``name@host``; ``(None, host)`` for a bare host."""
    parts = name.split(NODENAME_SEP, 1)
    if len(parts) == 1:
        return None, parts[0]
    return parts[0], parts[1]


def default_nodename(hostname: str | None) -> str:
    """``hostname`` as a node name: ``celery@<host>`` when it has no name part."""
    name, host = nodesplit(hostname or "")
    return nodename(name or NODENAME_DEFAULT, host or gethostname())
