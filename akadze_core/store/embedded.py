"""The embedded Postgres (pgserver) used when no database URL is configured anywhere.

Where it lives (the directory that holds ``pgdata/``) follows one rule, so that every
process of a project finds the same database wherever it is started:

1. ``$AKADZE_HOME`` if set (``$AKADZE_EMBEDDED_DIR`` is still read, deprecated);
2. else ``<project root>/.akadze``, the project root being the nearest directory, from the
   current one upwards, that holds ``pyproject.toml``, ``setup.py``, ``setup.cfg``, ``.git``
   or an ``.akadze/`` made earlier;
3. else the per-user data directory ``$XDG_DATA_HOME/akadze`` (default
   ``~/.local/share/akadze``), on every OS.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..model.dsn import redact
from ..model.errors import ConfigurationError, NoDatabaseError

__all__ = ["HOME_ENV", "PROJECT_MARKERS", "EmbeddedHome", "NoDatabaseError", "describe_database",
           "embedded_home", "embedded_url"]

logger = logging.getLogger("akadze.embedded")

#: The environment variable naming the directory that holds ``pgdata/``.
HOME_ENV = "AKADZE_HOME"
#: Its former name, still read (after ``AKADZE_HOME``).
LEGACY_ENV = "AKADZE_EMBEDDED_DIR"
#: The directory made under the project root.
DEFAULT_DIRECTORY = ".akadze"
#: The files (or directories) that mark a project root. Not ``manage.py``: a Django project
#: often keeps it one level below the repository's ``pyproject.toml``/``.git``, and a second
#: root there would split the project into two databases.
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
# Set once this process has announced a location: children (``--processes``, prefork)
# inherit it and keep quiet about the same location.
_ANNOUNCED_ENV = "_AKADZE_EMBEDDED_ANNOUNCED"

_servers: dict[Path, object] = {}
#: The URL of each embedded Postgres this process started or joined, and its data directory.
_urls: dict[str, Path] = {}


@dataclass(frozen=True)
class EmbeddedHome:
    """Where the embedded Postgres lives: ``directory / "pgdata"``, and why there."""

    directory: Path
    #: How the rule chose it, for the one log line (e.g. ``"$AKADZE_HOME"``).
    reason: str

    @property
    def pgdata(self) -> Path:
        """The Postgres data directory."""
        return self.directory / "pgdata"

    def exists(self) -> bool:
        """Whether a database was created here (initdb writes ``PG_VERSION`` first)."""
        return (self.pgdata / "PG_VERSION").is_file()


def _user_data_directory(environ: Mapping[str, str]) -> Path:
    # By hand rather than platformdirs: one documented place on every OS, and no dependency
    # for the read-only commands of an install without the embedded extra.
    base = environ.get("XDG_DATA_HOME") or ""
    if os.path.isabs(base):  # the XDG spec: a relative value is ignored
        return Path(base) / "akadze"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".local" / "share" / "akadze"


def _project_root(start: Path) -> tuple[Path, str] | None:
    for directory in (start, *start.parents):
        if (directory / DEFAULT_DIRECTORY).is_dir():
            return directory, f"{DEFAULT_DIRECTORY}/"
        for marker in PROJECT_MARKERS:
            if (directory / marker).exists():
                return directory, marker
    return None


def embedded_home(start: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> EmbeddedHome:
    """Where the embedded Postgres of the project of ``start`` (default: the current
    directory) lives, by the rule in this module's docstring. Creates nothing."""
    environ = os.environ if environ is None else environ
    here = Path(start if start is not None else os.getcwd()).resolve()
    # A relative $AKADZE_HOME is taken from the current directory, like any relative path.
    if environ.get(HOME_ENV):
        return EmbeddedHome((here / environ[HOME_ENV]).resolve(), f"set by ${HOME_ENV}")
    if environ.get(LEGACY_ENV):
        return EmbeddedHome((here / environ[LEGACY_ENV]).resolve(),
                            f"set by ${LEGACY_ENV}, deprecated: use ${HOME_ENV}")
    found = _project_root(here)
    if found is not None:
        root, marker = found
        return EmbeddedHome(root / DEFAULT_DIRECTORY, f"the project root, found by its {marker}")
    return EmbeddedHome(_user_data_directory(environ).resolve(),
                        f"the per-user data directory: no project root above {here}")


def embedded_url(directory: str | os.PathLike[str] | None = None, *,
                 create: bool = True) -> str:
    """Start (or join) the embedded Postgres of this project; returns its URL.

    ``directory`` (holding ``pgdata/``) overrides the rule of ``embedded_home``. With
    ``create=False`` a database that does not exist yet is not made: ``NoDatabaseError``.
    pgserver shares one server between the processes of a project and stops it when the
    last one exits. The caller applies the schema.
    """
    home = (EmbeddedHome(Path(directory).resolve(), "the directory given")
            if directory is not None else embedded_home())
    path = home.pgdata
    server = _servers.get(path)
    if server is not None:
        return _known(server.get_uri(), path)  # type: ignore[attr-defined]
    if not create and not home.exists():
        raise NoDatabaseError(
            "no database: set AKADZE_DATABASE_URL, or run a worker or `akadze migrate` "
            f"first to create the embedded Postgres in {path} ({home.reason})")
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
    # Once per process tree: a worker's children join the same server without repeating it.
    level = logging.DEBUG if os.environ.get(_ANNOUNCED_ENV) == str(path) else logging.INFO
    os.environ[_ANNOUNCED_ENV] = str(path)
    logger.log(level, "using the embedded Postgres in %s (no database URL configured; "
               "%s)", path, home.reason)
    return _known(server.get_uri(), path)  # type: ignore[attr-defined]


def _known(url: str, pgdata: Path) -> str:
    _urls[url] = pgdata
    return url


def describe_database(url: str) -> str:
    """Which database ``url`` is, for a line a person reads: ``the embedded Postgres in
    <pgdata>`` for one this process started or joined, else the URL without its password."""
    pgdata = _urls.get(url)
    if pgdata is not None:
        return f"the embedded Postgres in {pgdata}"
    return redact(url)
