"""One dashboard's configuration (``DashboardConfig``) and the state behind its app
(``Dashboard``): its akadze App, its own connection pool, its secrets, the authentication and
CSRF checks every page and API endpoint goes through, signed notices and page rendering.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import math
import secrets
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import psycopg
import psycopg_pool
from jinja2 import Environment, PackageLoader
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute

from ..model.dsn import redact_password
from ..model.jobs import JOB_STATES
from ..model.task_ids import TaskIds
from ..store import lookup
from ..store.connections import close_when_collected
from . import data
from .auth import (
    CSRF_COOKIE,
    HOST_PREFIX,
    MAX_BODY,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    Caller,
    LoginThrottle,
    Sessions,
)

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.dashboard")
T = TypeVar("T")

#: What a ``?notice=`` code shows; anything else (or an unsigned notice) shows nothing.
NOTICES = {
    "requeued": "job {job} requeued",
    "not-requeued": "job {job} was not requeued: only failed jobs can be",
    "cancel-requested": "job {job}: cancel requested",
    "not-cancelled": "job {job} was not cancelled: only queued or running jobs can be",
    "terminate-requested": "job {job}: terminate requested (SIGTERM to the process running "
                           "it, in a process pool)",
    "not-terminated": "job {job} was not terminated: only running jobs can be",
    "worker-control": "worker {worker}: {what}",
    "purged": "queue {queue} purged: {n} queued jobs deleted",
    "paused": "queue {queue} paused: no worker starts its jobs until it is resumed",
    "not-paused": "queue {queue} was paused already",
    "resumed": "queue {queue} resumed",
    "not-resumed": "queue {queue} was not paused",
    "bulk-retry": "bulk retry: requeued {changed} of {selected} matching jobs{more}",
    "bulk-cancel": "bulk cancel: cancel requested for {changed} of {selected} matching "
                   "jobs{more}",
}
_NOTICE_FIELDS = ("job", "queue", "n", "changed", "selected", "worker", "what")


@dataclass
class DashboardConfig:
    """How a dashboard authenticates and what it may do.

    ``basic_auth``: user -> password (HTTP basic). ``tokens``: bearer tokens (an
    ``Authorization: Bearer`` header, or the login form, which sets a session cookie).
    ``authorize``: a callable of the request that says whether the caller may use the
    dashboard and its actions: for a parent app that authenticates on its own (it may read
    ``request.scope["user"]`` set by the parent's middleware). With none of the three, the
    pages are open and the actions off. ``read_only`` turns the actions off whatever the
    credentials. ``origins``: more origins (``https://dash.example``) a form may come from,
    besides the request's own (for a proxy that rewrites ``Host``). ``session_lifetime``:
    seconds a login session lasts. ``max_body``: the largest request body read (bytes).
    ``login_attempts``/``login_backoff_max``: from this many wrong logins from one address
    on, each locks the address out, for 1 s, then 2 s, 4 s ... up to this many seconds.
    """

    basic_auth: Mapping[str, str] = field(default_factory=dict)
    tokens: Sequence[str] = ()
    authorize: Callable[[Request], bool] | None = None
    read_only: bool = False
    title: str = "akadze"
    page_size: int = 50
    origins: Sequence[str] = ()
    session_lifetime: float = 12 * 3600.0
    max_body: int = MAX_BODY
    login_attempts: int = 5
    login_backoff_max: float = 60.0
    #: More routes, each callable given the ``Dashboard`` (``akadze-compat flower`` adds
    #: Flower's HTTP API this way); they come first, so one may serve a path of its own
    #: (``/metrics`` with more series). Wrap their handlers with ``Dashboard.api``.
    extensions: Sequence[Callable[[Dashboard], Sequence[BaseRoute]]] = ()

    @property
    def has_credentials(self) -> bool:
        """Whether any credential (or a parent's check) guards the dashboard."""
        return bool(self.basic_auth or self.tokens or self.authorize)


class Dashboard:
    """The state behind one dashboard app: its akadze App, its pool and its secrets."""

    def __init__(self, app: App, config: DashboardConfig) -> None:
        self.app = app
        self.config = config
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._lock = threading.Lock()
        # Keys the CSRF tokens and notices; per process, like the sessions: a restart
        # logs token sessions out and asks open forms to be reloaded.
        self._secret = secrets.token_bytes(32)
        self.sessions = Sessions(config.session_lifetime)
        self.throttle = LoginThrottle(config.login_attempts, config.login_backoff_max)
        self.templates = Environment(loader=PackageLoader("akadze_core", "dashboard/templates"),
                                     autoescape=True, trim_blocks=True, lstrip_blocks=True)
        self.templates.filters["when"] = _when
        self.templates.filters["pretty"] = _pretty
        self.templates.filters["count"] = _count
        self.templates.filters["seconds"] = _seconds
        self._task_ids: TaskIds | None = None

    # --- database ---------------------------------------------------------------------------

    def task_ids(self, connection: psycopg.Connection) -> TaskIds:
        """The database's derived task ids, its key read once (on ``connection``)."""
        if self._task_ids is None:
            self._task_ids = TaskIds(lookup.task_id_key(connection))
        return self._task_ids

    def pool(self) -> psycopg_pool.ConnectionPool:
        """The dashboard's own pool (opened on first use: a mounted app gets no lifespan).

        Never prepared statements: the jobs list's one statement serves every combination
        of filters, and a generic plan would not use the index each combination needs.
        """
        with self._lock:
            if self._pool is None:
                kwargs = {**self.app.connection_kwargs, "autocommit": True,
                          "prepare_threshold": None}
                self._pool = psycopg_pool.ConnectionPool(
                    self.app.database_url, min_size=1, max_size=4, timeout=10, kwargs=kwargs,
                    name="akadze-dashboard", open=True)
                close_when_collected(self, self._pool)
            return self._pool

    def close(self) -> None:
        """Close the pool (the standalone server's shutdown)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def read(self, call: Callable[[psycopg.Connection], T]) -> T:
        """``call(connection)`` on a pooled connection, in the thread pool."""
        def work() -> T:
            with self.pool().connection() as connection:
                return call(connection)
        return await run_in_threadpool(work)

    # --- authentication ---------------------------------------------------------------------

    @staticmethod
    def cookie_name(request: Request, name: str) -> str:
        """``name`` as this request's cookies spell it: ``__Host-`` prefixed over https."""
        return HOST_PREFIX + name if request.url.scheme == "https" else name

    def cookie(self, request: Request, name: str) -> str:
        """The value of cookie ``name`` as this request spells it ("" without one). Over
        https an unprefixed cookie of the same name (which a sibling could set) is ignored."""
        return request.cookies.get(self.cookie_name(request, name), "")

    def set_cookie(self, request: Request, response: Response, name: str, value: str) -> None:
        """Set cookie ``name``: HttpOnly, SameSite=Strict; over https ``__Host-``, Secure
        and Path=/ (the prefix demands both); over http the dashboard's own path."""
        secure = request.url.scheme == "https"
        response.set_cookie(self.cookie_name(request, name), value,
                            path="/" if secure else base_path(request) or "/",
                            httponly=True, samesite="strict", secure=secure)

    def delete_cookie(self, request: Request, response: Response, name: str) -> None:
        """Remove cookie ``name`` (set the same way, so the browser matches it)."""
        secure = request.url.scheme == "https"
        response.delete_cookie(self.cookie_name(request, name),
                               path="/" if secure else base_path(request) or "/",
                               httponly=True, samesite="strict", secure=secure)

    def _sign(self, purpose: str, text: str) -> str:
        return hmac.new(self._secret, f"{purpose}\0{text}".encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def client_address(request: Request) -> str:
        """The peer's address (what wrong logins are counted by)."""
        return request.client.host if request.client else "unknown"

    def authenticate(self, request: Request) -> Caller | None:
        """Who the request is and what its CSRF token is bound to, or None. A wrong
        credential counts against the client's address (see ``LoginThrottle``)."""
        config = self.config
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        value = value.strip()
        wrong = False
        if scheme.lower() == "basic" and config.basic_auth:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            expected = config.basic_auth.get(user)
            if expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                return Caller(f"user {user}", f"basic\0{user}\0{password}")
            wrong = True
        if scheme.lower() == "bearer" and config.tokens:
            if any(hmac.compare_digest(token.encode(), value.encode())
                   for token in config.tokens):
                return Caller("token", f"bearer\0{value}")
            wrong = True
        if wrong:
            self.throttle.failed(self.client_address(request))
        session_id = self.cookie(request, SESSION_COOKIE)
        if config.tokens and self.sessions.valid(session_id):
            return Caller("token", f"session\0{session_id}")
        if config.authorize is not None and config.authorize(request):
            # The parent's user, when its middleware set one (the token adds this browser's
            # own cookie: the parent's session is not ours to read).
            parent_user = request.scope.get("user")
            name = parent_user if isinstance(parent_user, str) else str(
                getattr(parent_user, "identity", None) or getattr(parent_user, "pk", None)
                or getattr(parent_user, "username", None) or "")
            return Caller("parent", f"parent\0{name}")
        return None

    def identify(self, request: Request) -> str | None:
        """Who the request is ("user NAME", "token", "parent"), or None."""
        caller = self.authenticate(request)
        return caller.identity if caller else None

    def presents_credentials(self, request: Request) -> bool:
        """Whether the request carries credentials to check (a login attempt)."""
        scheme = request.headers.get("authorization", "").partition(" ")[0].lower()
        return (scheme == "basic" and bool(self.config.basic_auth)) or (
            scheme == "bearer" and bool(self.config.tokens))

    def can_act(self, identity: str | None) -> bool:
        """Whether actions are offered: not read-only, and the caller authenticated."""
        return not self.config.read_only and identity is not None

    def csrf_token(self, request: Request) -> str:
        """The token this request's forms carry: an HMAC (with the per-process secret) of
        the caller's session or credentials (under a parent's authentication, and before
        login, with this browser's own cookie), so a cookie another site set, or a token
        of another session, is worth nothing. "" when there is nothing to bind it to (no
        such cookie): no form matches that."""
        caller: Caller | None = getattr(request.state, "caller", None)
        if caller is not None and caller.identity != "parent":
            return self._sign("csrf", caller.binding)
        browser = getattr(request.state, "browser", "") or self.cookie(request, CSRF_COOKIE)
        if not browser:
            return ""
        binding = caller.binding if caller else "anonymous"
        return self._sign("csrf", f"{binding}\0{browser}")

    def own_origins(self, request: Request) -> set[str]:
        """The origins a form of this dashboard comes from: the request's own (and its
        https form when served plain behind a TLS proxy that keeps ``Host``), and the
        configured ``origins``."""
        host = request.headers.get("host", "")
        scheme = request.url.scheme
        own = {f"{scheme}://{host}"}
        if scheme == "http":
            own.add(f"https://{host}")
        return own | {origin.rstrip("/") for origin in self.config.origins}

    def check_csrf(self, request: Request, form: Mapping[str, str]) -> bool:
        """A state-changing request is from this dashboard's own page: its form carries
        this caller's token, and a browser that says where the request came from says
        here (``Sec-Fetch-Site`` same-origin or none; ``Origin`` one of ours, never
        ``null``, which a cross-site redirect or a sandboxed frame sends)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.own_origins(request):
            return False
        sent, expected = form.get("csrf", ""), self.csrf_token(request)
        return bool(sent and expected) and hmac.compare_digest(expected.encode(), sent.encode())

    # --- admission: pages and API ------------------------------------------------------------

    async def admit(self, request: Request, *, api: bool = False) -> Response | None:
        """Authenticate ``request`` (when credentials are configured): None to go on, or
        the answer that refuses it (429 while its address is locked out, 401, a redirect to
        the login form for a page, 403). Sets ``request.state.caller`` and ``identity``."""
        address = self.client_address(request)
        if self.presents_credentials(request):
            wait = self.throttle.retry_after(address)
            if wait > 0:
                return self.too_many(wait)
        # A parent's check may block (a Django ORM query): off the event loop.
        caller = (await run_in_threadpool(self.authenticate, request)
                  if self.config.authorize is not None else self.authenticate(request))
        if caller is not None and self.presents_credentials(request):
            self.throttle.succeeded(address)
        request.state.caller = caller
        identity = request.state.identity = caller.identity if caller else None
        if self.config.has_credentials and identity is None:
            if self.config.basic_auth:
                return PlainTextResponse(
                    "authentication required", status_code=401, headers={
                        **SECURITY_HEADERS, "WWW-Authenticate": 'Basic realm="akadze"'})
            if self.config.tokens:
                if api:
                    return PlainTextResponse("authentication required", status_code=401,
                                             headers={**SECURITY_HEADERS,
                                                      "WWW-Authenticate": "Bearer"})
                return RedirectResponse(f"{base_path(request)}/login", status_code=303)
            return PlainTextResponse("forbidden", status_code=403, headers=SECURITY_HEADERS)
        return None

    def cross_site(self, request: Request) -> bool:
        """Whether a browser says the request comes from another site (``Sec-Fetch-Site``
        other than same-origin/none, or an ``Origin`` not ours, ``null`` included)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return True
        origin = request.headers.get("origin")
        return origin is not None and origin not in self.own_origins(request)

    def api(self, handler: Callable[[Request], Awaitable[Response]], *,
            action: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` as an API endpoint behind the dashboard's rules: authenticated as the
        pages are (basic auth or a bearer token for a client such as Flower's), and for an
        ``action`` (a state-changing POST) allowed only when actions are (credentials, not
        read-only), never from a browser on another site, and, for a caller known by a
        cookie (a token login's session, a parent's authentication), only with this
        caller's CSRF token in ``X-CSRF-Token``. Database
        errors answer 503 with a scrubbed message."""
        async def endpoint(request: Request) -> Response:
            refused = await self.admit(request, api=True)
            if refused is not None:
                return refused
            if action:
                why = self.refuse_action(request)
                if why is not None:
                    return PlainTextResponse(why, status_code=403, headers=SECURITY_HEADERS)
                logger.info("%s by %s", request.url.path, request.state.identity)
            try:
                return await handler(request)
            except psycopg.Error as exc:
                message = self.scrub(f"database error: {type(exc).__name__}: {exc}")
                logger.warning("%s %s: %s", request.method, request.url.path, message)
                return PlainTextResponse(message, status_code=503, headers=SECURITY_HEADERS)
            except psycopg_pool.PoolTimeout as exc:
                return PlainTextResponse(self.scrub(f"database unreachable: {exc}"),
                                         status_code=503, headers=SECURITY_HEADERS)
        return endpoint

    def refuse_action(self, request: Request) -> str | None:
        """Why an API action is refused (None: allowed); see ``api``."""
        identity = request.state.identity
        if not self.can_act(identity):
            return ("the dashboard is read-only" if self.config.read_only else
                    "actions need credentials (start the dashboard with --basic-auth or "
                    "--token)")
        if self.cross_site(request):
            return "refused: the request comes from another site"
        caller: Caller | None = request.state.caller
        if caller is not None and caller.binding.startswith(("session\0", "parent\0")):
            sent = request.headers.get("x-csrf-token", "")
            expected = self.csrf_token(request)
            if not (sent and expected and hmac.compare_digest(expected.encode(),
                                                              sent.encode())):
                return "CSRF check failed: send this session's token in X-CSRF-Token"
        return None

    # --- notices ----------------------------------------------------------------------------

    def notice_query(self, code: str, **values: str | int) -> str:
        """The query string of a notice: its code and values, signed (an unsigned or
        altered notice shows nothing, so a link cannot put its own words on the page)."""
        # Its values as n-NAME: apart from the page's own parameters (a list's queue filter).
        fields = {"notice": code, **{f"n-{key}": str(value) for key, value in values.items()}}
        signed = urlencode(sorted(fields.items()))
        return urlencode({**fields, "ns": self._sign("notice", signed)[:32]})

    def notice(self, request: Request) -> str | None:
        """The message of the request's notice, when it is one of ours."""
        params = request.query_params
        code = params.get("notice", "")
        template = NOTICES.get(code)
        if template is None:
            return None
        fields = {"notice": code, **{f"n-{key}": params[f"n-{key}"] for key in _NOTICE_FIELDS
                                     if f"n-{key}" in params}}
        expected = self._sign("notice", urlencode(sorted(fields.items())))[:32]
        if not hmac.compare_digest(expected.encode(), params.get("ns", "").encode()):
            return None
        values = {key: fields.get(f"n-{key}", "") for key in _NOTICE_FIELDS}
        selected = values["selected"]
        values["more"] = (" (the first batch: run it again for more)"
                          if selected.isdigit() and int(selected) >= data.BULK_LIMIT else "")
        return template.format(**values)

    # --- responses --------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """A page from template ``name``, with the security headers and this browser's
        cookie (which binds the login form's token)."""
        base = base_path(request)
        identity = getattr(request.state, "identity", None)
        browser = self.cookie(request, CSRF_COOKIE)
        fresh = not browser
        if fresh:
            browser = request.state.browser = secrets.token_urlsafe(24)
        html = self.templates.get_template(name).render(
            base=base, config=self.config, identity=identity, can_act=self.can_act(identity),
            csrf=self.csrf_token(request), notice=self.notice(request), states=JOB_STATES,
            path=request.url.path, query=request.url.query, **context)
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if fresh:
            self.set_cookie(request, response, CSRF_COOKIE, browser)
        return response

    def error(self, request: Request, status: int, message: str) -> Response:
        """An error page with ``message`` (escaped like everything else)."""
        return self.render(request, "error.html", status=status, message=message)

    def too_many(self, retry_after: float) -> Response:
        """429 for an address locked out after wrong logins."""
        seconds = max(1, math.ceil(retry_after))
        return PlainTextResponse(
            f"too many wrong logins from this address: try again in {seconds} s",
            status_code=429, headers={**SECURITY_HEADERS, "Retry-After": str(seconds)})

    def scrub(self, text: str) -> str:
        """``text`` without the database password (for error pages and logs)."""
        return self.app.redact(redact_password(text, None))


def base_path(request: Request) -> str:
    """The prefix the dashboard is mounted under ("" at the root)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _count(value: int, cap: int = data.COUNT_CAP) -> str:
    return f"{value:,}+" if value >= cap else f"{value:,}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
