"""Where the database is, and how to talk about it without leaking its password."""

from __future__ import annotations

import os
import re

import psycopg.conninfo

ENV_VAR = "AKADZE_DATABASE_URL"

# password=... in key/value DSNs, and the userinfo password in URLs.
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)


def redact(text: str) -> str:
    """Replace every DSN password found in ``text`` with ``***``."""
    # Fast path: a worker logs a line per job, and almost none holds a DSN.
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\1***\3", text)
    if "=" in text:
        text = _KV_PASSWORD.sub(r"\1***", text)
    return text


def redact_password(text: str, password: str | None) -> str:
    """Redact DSN shapes and also the literal password (error messages may quote it)."""
    text = redact(text)
    if password:
        text = text.replace(password, "***")
    return text


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
