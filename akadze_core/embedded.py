"""The embedded Postgres (pgserver) used when no database URL is configured anywhere."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from .errors import ConfigurationError

logger = logging.getLogger("akadze.embedded")

DEFAULT_DIRECTORY = ".akadze"
_servers: dict[Path, object] = {}


def embedded_url(directory: str | os.PathLike[str] | None = None) -> str:
    """Start (or join) the private Postgres under ``.akadze/`` of the current project.

    pgserver shares one server between the processes of a project and stops it when the
    last one exits. The caller applies the schema.
    """
    path = Path(directory or os.environ.get("AKADZE_EMBEDDED_DIR") or DEFAULT_DIRECTORY)
    path = path.resolve() / "pgdata"
    server = _servers.get(path)
    if server is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                import pgserver  # type: ignore[import-untyped]
        except ImportError as exc:
            raise ConfigurationError(
                "no database configured: set AKADZE_DATABASE_URL, pass a URL, or install "
                "the embedded Postgres with `pip install akadze[embedded]`"
            ) from exc
        path.parent.mkdir(parents=True, exist_ok=True)
        # pgserver narrates every initdb/pg_ctl call at INFO; one line of ours is enough.
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp: fine.
            warnings.simplefilter("ignore", UserWarning)
            server = pgserver.get_server(path, cleanup_mode="stop")
        _servers[path] = server
        logger.info("no database configured: using the embedded Postgres in %s", path)
    return server.get_uri()  # type: ignore[attr-defined,no-any-return]
