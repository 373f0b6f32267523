"""Which database errors are worth retrying (seed 000, behaviour of 0.6.0)."""

from __future__ import annotations

import psycopg
import psycopg_pool

from ..model.errors import SchemaMissing
from .migrations import schema_missing

#: invalid_sql_statement_name, duplicate_prepared_statement: a prepared statement missing on
#: (or already on) the server connection, which happens when a transaction pooler hands the
#: session's transactions to different server connections.
PREPARED_STATEMENT_LOST = ("26000", "42P05")
PREPARED_STATEMENT_HINT = (
    "a prepared statement was lost between transactions: the connection goes through a "
    "transaction pooler (PgBouncer in transaction mode keeps no prepared statements before "
    "1.21): set AKADZE_PREPARE_THRESHOLD=off (or App(prepare_threshold='off'))")

#: read_only_sql_transaction: a write reached a server that takes none. A standby found by
#: a multi-host URL while the primary is down, or a URL that names a replica: waiting does
#: not help (a standby may stay one), choosing the writable host at connect time does.
READ_ONLY = "25006"
READ_ONLY_HINT = (
    "the server is read-only (a hot standby, or default_transaction_read_only is on): point "
    "the database URL at the primary; with several hosts (postgresql://a:5432,b:5432/db or "
    "host=a,b) add target_session_attrs=read-write, so that every connection picks the "
    "writable one and a promoted replica is found after a failover")

#: What a statement on akadze's tables raises when the schema was never applied.
SCHEMA_ERRORS = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)

# Retry these: the server restarted or failed over, the connection dropped, it is full,
# or the statement lost a deadlock / serialization race.
_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53300",  # too_many_connections
    "53000",  # insufficient_resources
    "55P03",  # lock_not_available
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
}
_TRANSIENT_CLASSES = ("08",)  # connection_exception

# Connection failures that no amount of waiting fixes.
_FATAL_CONNECT_MESSAGES = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",  # role or database
    "invalid dsn",
    "invalid connection option",
    "missing \"=\" after",
    "invalid uri",
    "permission denied",
    "ssl is not enabled",
)


def is_transient(exc: BaseException) -> bool:
    """True for errors a worker should log and retry with backoff. A lost prepared
    statement is one: it ran nothing, and the retry goes unprepared (``Connections.stop_preparing``,
    called where the error is met)."""
    if isinstance(exc, psycopg_pool.PoolTimeout | TimeoutError | ConnectionError):
        return True
    if is_prepared_statement_lost(exc):
        return True
    if not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.ProgrammingError):
        return False
    sqlstate = exc.sqlstate
    if sqlstate:
        return sqlstate in _TRANSIENT_SQLSTATES or sqlstate.startswith(_TRANSIENT_CLASSES)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        message = str(exc).lower()
        return not any(fatal in message for fatal in _FATAL_CONNECT_MESSAGES)
    return False


def is_prepared_statement_lost(exc: BaseException) -> bool:
    """True when a prepared statement was missing on (or already on) the server connection
    (26000 / 42P05): a transaction pooler gave the session another server connection. The
    error comes from Parse or Bind, so the statement ran nothing and may be sent again,
    unprepared."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in PREPARED_STATEMENT_LOST


def is_lock_timeout(exc: BaseException) -> bool:
    """True when a statement gave up waiting for a lock (55P03, after ``lock_timeout``): it
    changed nothing and its connection is fine."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == "55P03"


#: What the server says when it refuses a connection for want of a free slot (53300): to
#: anyone when ``max_connections`` is reached, and to a role without the right to the
#: reserved slots when only those are left (``superuser_reserved_connections``; Postgres
#: 16's ``reserved_connections``); also a role's own ``CONNECTION LIMIT``.
_NO_FREE_SLOT_MESSAGES = ("too many clients already", "remaining connection slots are reserved",
                          "too many connections for role")


def is_too_many_connections(exc: BaseException) -> bool:
    """True when the server refused a connection because it has no free slot for this role
    (53300; on a refused connection psycopg has only the server's message)."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate == "53300":
        return True
    message = str(exc)
    return any(text in message for text in _NO_FREE_SLOT_MESSAGES)


def fatal_message(exc: BaseException) -> str:
    """One line telling the user what is wrong (passwords are scrubbed by the caller)."""
    if isinstance(exc, SchemaMissing):
        return str(exc)
    if isinstance(exc, psycopg.Error):
        if isinstance(exc, SCHEMA_ERRORS):
            return str(schema_missing())
        if exc.sqlstate in PREPARED_STATEMENT_LOST:
            return PREPARED_STATEMENT_HINT
        if exc.sqlstate == READ_ONLY:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "read-only"
            return f"{READ_ONLY_HINT} ({first})"
        if exc.sqlstate == "42501":
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "permission denied"
            return f"permission denied: {first}"
        text = " ".join(str(exc).split())
        return f"database error: {text}" if text else f"database error: {type(exc).__name__}"
    return f"{type(exc).__name__}: {exc}"
