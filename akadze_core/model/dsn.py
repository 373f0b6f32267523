"""Where the database is, and how to talk about it without leaking its password."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg.conninfo

ENV_VAR = "AKADZE_DATABASE_URL"
#: psycopg's ``prepare_threshold`` for every connection akadze opens: ``off`` for a pooler
#: that does not keep prepared statements (PgBouncer before 1.21 in transaction mode).
PREPARE_VAR = "AKADZE_PREPARE_THRESHOLD"
#: A direct connection (not through a transaction pooler) for the workers' LISTEN.
LISTEN_VAR = "AKADZE_LISTEN_URL"
#: psycopg's own default: a statement is prepared on the server at its fifth execution.
DEFAULT_PREPARE_THRESHOLD = 5

# password=... in key/value DSNs, and the userinfo password in URLs.
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)


def redact(text: str) -> str:
    """Replace every DSN password found in ``text`` with ``***``."""
    # Fast path: a worker logs a line per job, and almost none holds a DSN. A lone "/" is
    # found by memchr, "://" by a search several times as slow (a line's time has colons).
    if "/" in text and "://" in text:
        text = _URL_PASSWORD.sub(r"\1***\3", text)
    if "=" in text:
        text = _KV_PASSWORD.sub(r"\1***", text)
    return text


#: The attribute that marks a redactor as ``by_substrings``.
BY_SUBSTRINGS = "redacts_by_substrings"

_F = TypeVar("_F", bound=Callable[..., Any])


def by_substrings(redact: _F) -> _F:
    """Mark ``redact`` as one that only replaces substrings it finds (a DSN's password, a
    literal password), as ``redact_password`` does: whatever it would change in one of
    several lines it changes in their join too, so a join it leaves as it is holds no line
    it would change (``Secrets.scrub_lines`` then skips the lines, a call each)."""
    setattr(redact, BY_SUBSTRINGS, True)
    return redact


def redact_password(text: str, password: str | None) -> str:
    """Redact DSN shapes and also the literal password (error messages may quote it)."""
    text = redact(text)
    if password:
        text = text.replace(password, "***")
    return text


def redact_json(value: Any, scrub: Callable[[str], str] = redact) -> Any:
    """A decoded JSON value with ``scrub`` applied to every string in it (keys included)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [redact_json(item, scrub) for item in value]
    if isinstance(value, dict):
        return {redact_json(key, scrub): redact_json(item, scrub) for key, item in value.items()}
    return value


def password_of(dsn: str) -> str | None:
    """The password in a DSN, if any (used only to scrub it from messages)."""
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn).get("password")  # type: ignore[return-value]
    except psycopg.ProgrammingError:
        # A malformed DSN: libpq's message may quote the raw password (``invalid
        # percent-encoded token: "<password>"``), so find it the lenient way and scrub it.
        match = _URL_PASSWORD.search(dsn) or _KV_PASSWORD.search(dsn)
        return (match.group(2).strip("'") or None) if match else None


def configured_url(explicit: str | None = None) -> str | None:
    """The explicit URL, else ``AKADZE_DATABASE_URL``, else None (the embedded Postgres)."""
    return explicit or os.environ.get(ENV_VAR) or None


def prepare_threshold(value: int | str | None = None) -> int | None:
    """The ``prepare_threshold`` to open connections with: ``value`` if given, else
    ``$AKADZE_PREPARE_THRESHOLD``, else psycopg's default 5. ``off``/``none`` (or None given
    explicitly through the variable) turns server-side prepared statements off, which a
    transaction pooler needs: PgBouncer (before 1.21) hands each transaction to any server
    connection, where a statement prepared on another one does not exist."""
    if value is None:
        value = os.environ.get(PREPARE_VAR) or DEFAULT_PREPARE_THRESHOLD
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "none", "no", "false", "0"):
            return None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{PREPARE_VAR}={value!r}: a number of executions, or off") from None
    if value < 0:
        raise ValueError(f"prepare_threshold must be at least 0 or off, not {value!r}")
    return value


def listen_url(database_url: str) -> str:
    """Where workers LISTEN: ``$AKADZE_LISTEN_URL`` (a direct connection, when the database URL
    goes through a transaction pooler, where LISTEN does not work), else the database URL."""
    return os.environ.get(LISTEN_VAR) or database_url
