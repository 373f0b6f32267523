"""The dashboard's ASGI app (Starlette, Jinja2 templates): pages, actions, authentication.

Safe by default: every value is escaped by Jinja2's autoescape (args, results and
tracebacks are user data), no page runs a script (the Content-Security-Policy forbids
them), actions need credentials and a CSRF token, and ``read_only`` removes them. The
database work runs in Starlette's thread pool on a small pool of its own, apart from the
app's: the dashboard never takes a connection an enqueue or a worker would want.
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
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlencode

import psycopg
import psycopg_pool
from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ..model.dsn import redact_password
from ..model.jobs import JOB_STATES
from ..model.task_ids import TaskIds
from ..store import lookup
from . import charts, data

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.dashboard")
T = TypeVar("T")

#: The per-browser cookie that binds the login form's CSRF token (and, for a parent's
#: authentication, the actions' token) to this browser.
CSRF_COOKIE = "akadze_csrf"
#: The token login's session cookie: a random session id, looked up server-side.
SESSION_COOKIE = "akadze_session"
#: Over https both cookies carry this prefix: the browser then refuses the cookie unless it
#: is Secure, host-only and Path=/, so a sibling subdomain or plain-http port cannot set it.
#: Over plain http the prefix cannot be used (it needs Secure, which browsers refuse on
#: http://some.name; Chromium accepts it on http://127.0.0.1 and localhost only), and the
#: defence does not rest on it: the CSRF token is an HMAC of the authenticated session.
HOST_PREFIX = "__Host-"
#: The largest request body read (a form is a few hundred bytes; a bulk form a few KiB).
MAX_BODY = 64 * 1024
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
    "bulk-retry": "bulk retry: requeued {changed} of {selected} matching jobs{more}",
    "bulk-cancel": "bulk cancel: cancel requested for {changed} of {selected} matching "
                   "jobs{more}",
}
_NOTICE_FIELDS = ("job", "queue", "n", "changed", "selected", "worker", "what")
#: Seconds between reloads of a jobs list that follows new jobs.
FOLLOW_REFRESH = 5
#: No script may run on a page, whatever a job's data holds; styles are inline.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


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


class Sessions:
    """Token-login sessions, kept server-side: the cookie holds a random id, and logging out
    (or the lifetime passing) ends the session for every copy of that cookie.

    Ids are stored hashed (a lookup's timing says nothing about a stored id). At most
    ``cap`` live sessions: beyond, the oldest ends (only a right token creates one).
    """

    def __init__(self, lifetime: float, cap: int = 10_000) -> None:
        self.lifetime = lifetime
        self.cap = cap
        self._ends: dict[bytes, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(session_id: str) -> bytes:
        return hashlib.sha256(session_id.encode()).digest()

    def create(self) -> str:
        """A new session's id."""
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            if len(self._ends) >= self.cap:
                now = time.monotonic()
                self._ends = {key: end for key, end in self._ends.items() if end > now}
                while len(self._ends) >= self.cap:
                    del self._ends[min(self._ends, key=self._ends.__getitem__)]
            self._ends[self._key(session_id)] = time.monotonic() + self.lifetime
        return session_id

    def valid(self, session_id: str) -> bool:
        """Whether ``session_id`` is a live session."""
        if not session_id:
            return False
        key = self._key(session_id)
        with self._lock:
            end = self._ends.get(key)
            if end is not None and end <= time.monotonic():
                del self._ends[key]
                end = None
        return end is not None

    def end(self, session_id: str) -> None:
        """End the session (logout)."""
        with self._lock:
            self._ends.pop(self._key(session_id), None)


class LoginThrottle:
    """Wrong credentials per client address: after ``free`` of them, each further one locks
    the address out for 1 s, 2 s, 4 s ... up to ``longest`` s; a right login clears it, and
    an address forgets its failures after ``forget`` s without one. While locked out, no
    credential from the address is checked at all (a right guess would otherwise tell)."""

    def __init__(self, free: int, longest: float, forget: float = 900.0,
                 cap: int = 10_000) -> None:
        self.free = free
        self.longest = longest
        self.forget = forget
        self.cap = cap
        # address -> (failures, time of the last, locked until)
        self._seen: dict[str, tuple[int, float, float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: now)."""
        with self._lock:
            entry = self._seen.get(address)
        return max(0.0, entry[2] - time.monotonic()) if entry else 0.0

    def failed(self, address: str) -> None:
        """Count a wrong login from ``address``."""
        now = time.monotonic()
        with self._lock:
            failures, last, _ = self._seen.get(address, (0, now, 0.0))
            if now - last > self.forget:
                failures = 0
            failures += 1
            locked = 0.0
            if failures >= self.free:
                locked = now + min(self.longest, 2.0 ** min(failures - self.free, 30))
            if address not in self._seen and len(self._seen) >= self.cap:
                self._seen = {key: value for key, value in self._seen.items()
                              if now - value[1] <= self.forget or value[2] > now}
                if len(self._seen) >= self.cap:  # all recent: drop the oldest half
                    keep = sorted(self._seen.items(), key=lambda item: item[1][1])
                    self._seen = dict(keep[len(keep) // 2:])
            self._seen[address] = (failures, now, locked)

    def succeeded(self, address: str) -> None:
        """A right login from ``address``: forget its failures."""
        with self._lock:
            self._seen.pop(address, None)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is refused with 413 before it is
    read. A ``Content-Length`` over the limit is refused at once; a body without one
    (chunked) is counted as it arrives and refused when it passes the limit. The connection
    is then closed by the server with the rest of the body unread."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: MutableMapping[str, Any],
                       receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
                       send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.limit
            except ValueError:
                too_big = True
            if too_big:
                await _too_big(send)
                return
        seen = 0
        started = False

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooBig
            return message

        async def watched(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _BodyTooBig:
            if not started:
                await _too_big(send)


class _BodyTooBig(Exception):
    """A request body passed the limit while being read."""


async def _too_big(send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
    body = b"request body too large\n"
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
        *((key.lower().encode(), value.encode()) for key, value in SECURITY_HEADERS.items())]})
    await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class Caller:
    """Who a request is (``identity``: "user NAME", "token", "parent") and what its CSRF
    token is bound to (``binding``: its credentials or session, never sent to anyone)."""

    identity: str
    binding: str


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


def _parse_time(text: str | None) -> datetime | None:
    """A filter's time: ISO 8601 (``datetime-local`` inputs send no zone: UTC)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _filters(values: Mapping[str, str]) -> data.JobFilter:
    state = values.get("state") or None
    return data.JobFilter(
        state=state if state in JOB_STATES else None, queue=values.get("queue") or None,
        task=values.get("task") or None, since=_parse_time(values.get("since")),
        until=_parse_time(values.get("until")))


def _form(body: bytes) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(body.decode("utf-8", "replace"),
                                                      keep_blank_values=True).items()}


def _back(dashboard: Dashboard, request: Request, form: Mapping[str, str], code: str,
          **values: str | int) -> Response:
    """303 to the form's ``next`` (a path of this dashboard only) with notice ``code``."""
    base = base_path(request)
    target = form.get("next", "")
    if not target.startswith(base + "/") or target.startswith("//") or "\\" in target:
        target = base + "/"
    separator = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{separator}{dashboard.notice_query(code, **values)}",
                            status_code=303)


def create_app(app: App | None = None, *, database_url: str | None = None,
               config: DashboardConfig | None = None, **options: Any) -> Starlette:
    """The dashboard as an ASGI app, to serve (``akadze dashboard``) or to mount in a
    Starlette, FastAPI or Django (ASGI) project under any prefix.

    ``app``: the akadze App whose database (and code schedules) to show; else one on
    ``database_url`` (or the environment's). ``config`` or its fields as keywords
    (``read_only=True``, ``basic_auth={...}``, ``tokens=[...]``, ``authorize=...``).
    The returned app has ``state.dashboard`` (its ``Dashboard``; ``close()`` releases
    its connections).
    """
    from ..app import App

    if app is None:
        app = App(database_url)
    elif database_url is not None:
        raise TypeError("give app or database_url, not both")
    if config is None:
        config = DashboardConfig(**options)
    elif options:
        raise TypeError("give config or its fields as keywords, not both")
    dashboard = Dashboard(app, config)
    pages = Pages(dashboard)
    routes: list[BaseRoute] = [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/bulk", pages.bulk, methods=["POST"], name="bulk"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/jobs/{job_id:int}/retry", pages.retry, methods=["POST"], name="retry"),
        Route("/jobs/{job_id:int}/cancel", pages.cancel, methods=["POST"], name="cancel"),
        Route("/jobs/{job_id:int}/terminate", pages.terminate, methods=["POST"],
              name="terminate"),
        Route("/workers/{worker_id:int}/control", pages.worker_control, methods=["POST"],
              name="worker_control"),
        Route("/queues/purge", pages.purge, methods=["POST"], name="purge"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Route("/metrics", pages.metrics, name="metrics"),
        Route("/healthz", pages.healthz, name="healthz"),
    ]
    routes = [*(route for extend in config.extensions for route in extend(dashboard)),
              *routes]
    # Every route: no body is read past the limit (a login form must not be a way to fill
    # the process's memory before any credential is checked).
    web = Starlette(routes=routes, middleware=[Middleware(BodyLimit, limit=config.max_body)])
    web.state.dashboard = dashboard
    return web


Handler = Callable[[Request], Any]


def _guarded(method: Callable[[Pages, Request], Any]) -> Callable[[Pages, Request], Any]:
    """A page: authenticates first (when credentials are configured) and turns database
    errors into a scrubbed 503 page."""
    async def wrapper(self: Pages, request: Request) -> Response:
        dashboard = self.dashboard
        refused = await dashboard.admit(request)
        if refused is not None:
            return refused
        try:
            return await method(self, request)  # type: ignore[no-any-return]
        except psycopg.Error as exc:
            message = dashboard.scrub(f"database error: {type(exc).__name__}: {exc}")
            logger.warning("%s %s: %s", request.method, request.url.path, message)
            return dashboard.error(request, 503, message)
        except psycopg_pool.PoolTimeout as exc:
            return dashboard.error(request, 503, dashboard.scrub(f"database unreachable: {exc}"))
    return wrapper


def _action(method: Callable[[Pages, Request, dict[str, str]], Any]
            ) -> Callable[[Pages, Request], Any]:
    """An action: authenticated, allowed (not read-only), CSRF-checked."""
    async def wrapper(self: Pages, request: Request) -> Response:
        dashboard = self.dashboard
        identity = request.state.identity
        if not dashboard.can_act(identity):
            why = "the dashboard is read-only" if dashboard.config.read_only else \
                "actions need credentials (start the dashboard with --basic-auth or --token)"
            return dashboard.error(request, 403, why)
        form = _form(await request.body())
        if not dashboard.check_csrf(request, form):
            return dashboard.error(request, 403, "CSRF check failed: reload the page and "
                                                 "try again")
        logger.info("%s by %s: %s", request.url.path, identity,
                    {key: value for key, value in form.items() if key != "csrf"})
        return await method(self, request, form)  # type: ignore[no-any-return]
    return _guarded(wrapper)  # type: ignore[arg-type]


class Pages:
    """The request handlers of one dashboard."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    @_guarded
    async def overview(self, request: Request) -> Response:
        """Per queue counts, the last hour's throughput, failure rate and latency."""
        summary = await self.dashboard.read(data.overview)
        throughput = charts.bars("Jobs finished per minute, last hour", [
            charts.Series("succeeded", "#3a7d44", summary.succeeded),
            charts.Series("failed", "#c0392b", summary.failed)])
        failure = charts.lines("Failure rate per minute, last hour", [
            charts.Series("failed / finished", "#c0392b",
                          [None if r is None else r * 100 for r in summary.failure_rate])],
            unit="%")
        latency = charts.lines("Enqueue-to-start latency per minute, last hour", [
            charts.Series("p95", "#8e44ad", summary.latency_p95),
            charts.Series("mean", "#2980b9", summary.latency_avg)], unit=" s")
        return self.dashboard.render(request, "overview.html", summary=summary,
                                     charts=[throughput, failure, latency])

    @_guarded
    async def jobs(self, request: Request) -> Response:
        """The jobs list: filters, find by id, keyset pages."""
        params = request.query_params
        found_text = params.get("find", "").strip()
        base = base_path(request)
        if found_text:
            job = await self.dashboard.read(
                lambda c: data.find(c, found_text, self.dashboard.task_ids(c)))
            if job is not None:
                return RedirectResponse(f"{base}/jobs/{job.id}", status_code=303)
        filters = _filters(params)
        follow = params.get("follow") == "1"
        before_text = "" if follow else params.get("before", "")
        before = int(before_text) if before_text.isdigit() and len(before_text) < 19 else None

        def read(connection: psycopg.Connection) -> tuple[data.JobPage, list[str]]:
            return (data.job_page(connection, filters, before,
                                  self.dashboard.task_ids(connection),
                                  self.dashboard.config.page_size),
                    data.queue_names(connection))
        page, queues = await self.dashboard.read(read)
        keep = {key: params[key] for key in ("state", "queue", "task", "since", "until")
                if params.get(key)}
        next_url = None
        if page.next_before is not None:
            next_url = f"{base}/jobs?{urlencode({**keep, 'before': page.next_before})}"
        return self.dashboard.render(
            request, "jobs.html", page=page, filters=filters, values=keep, queues=queues,
            next_url=next_url, not_found=found_text if found_text else None,
            bulk_limit=data.BULK_LIMIT, first_url=f"{base}/jobs?{urlencode(keep)}",
            follow=follow, refresh=FOLLOW_REFRESH if follow else None,
            follow_url=f"{base}/jobs?{urlencode({**keep, 'follow': '1'})}")

    @_guarded
    async def job(self, request: Request) -> Response:
        """One job: its data, attempts, timeline and workflow relatives."""
        job_id = int(request.path_params["job_id"])

        def read(connection: psycopg.Connection) -> Any:
            job = lookup.get_job(connection, job_id)
            if job is None:
                return None
            task_id = self.dashboard.task_ids(connection).of(job.id, job.meta)
            return (job, task_id, data.relatives(connection, job),
                    data.timeline(job))
        found = await self.dashboard.read(read)
        if found is None:
            return self.dashboard.error(request, 404, f"job {job_id} not found")
        job, task_id, relatives, timeline = found
        return self.dashboard.render(request, "job.html", job=job, task_id=task_id,
                                     relatives=relatives, timeline=timeline)

    @_guarded
    async def workers(self, request: Request) -> Response:
        """Registered workers, their queues, running jobs and heartbeats."""
        workers, running = await self.dashboard.read(data.workers)
        return self.dashboard.render(request, "workers.html", workers=workers, running=running)

    @_guarded
    async def schedules(self, request: Request) -> Response:
        """Code and runtime schedules with their last and next runs."""
        app = self.dashboard.app
        listed = await self.dashboard.read(lambda c: data.schedules(c, app))
        return self.dashboard.render(request, "schedules.html", schedules=listed,
                                     has_code=bool(app.schedules))

    @_action
    async def retry(self, request: Request, form: dict[str, str]) -> Response:
        """Requeue a failed job."""
        job_id = int(request.path_params["job_id"])
        done = await self.dashboard.read(lambda c: data.retry(c, job_id))
        return _back(self.dashboard, request, form, "requeued" if done else "not-requeued",
                     job=job_id)

    @_action
    async def cancel(self, request: Request, form: dict[str, str]) -> Response:
        """Cancel a queued job, or ask a running one to stop."""
        job_id = int(request.path_params["job_id"])
        done = await self.dashboard.read(lambda c: data.cancel(c, job_id))
        return _back(self.dashboard, request, form,
                     "cancel-requested" if done else "not-cancelled", job=job_id)

    @_action
    async def terminate(self, request: Request, form: dict[str, str]) -> Response:
        """Cancel a running job and stop the process running it (SIGTERM)."""
        job_id = int(request.path_params["job_id"])
        done = await self.dashboard.read(lambda c: data.terminate(c, job_id))
        return _back(self.dashboard, request, form,
                     "terminate-requested" if done else "not-terminated", job=job_id)

    @_action
    async def worker_control(self, request: Request, form: dict[str, str]) -> Response:
        """Pool grow/shrink, add/cancel a consumer (queue), or shut down one live worker."""
        worker_id = int(request.path_params["worker_id"])
        command = form.get("action", "")
        if command not in data.WORKER_COMMANDS:
            return self.dashboard.error(request, 400, "unknown worker action")
        queue = form.get("queue", "").strip() or None
        if command in ("add_queue", "remove_queue") and (
                queue is None or len(queue) > 255
                or any(ord(char) < 32 or ord(char) == 127 for char in queue)):
            return self.dashboard.error(request, 400, "a queue name is 1-255 printable "
                                                      "characters")
        rows, _ = await self.dashboard.read(data.workers)
        worker = next((row for row in rows if row["id"] == worker_id and row["live"]), None)
        if worker is None:
            return self.dashboard.error(request, 404, f"no live worker {worker_id}")
        app = self.dashboard.app
        what = await run_in_threadpool(data.worker_control, app, worker["name"], command,
                                       queue)
        return _back(self.dashboard, request, {"next": f"{base_path(request)}/workers"},
                     "worker-control", worker=worker["name"], what=what)

    @_action
    async def purge(self, request: Request, form: dict[str, str]) -> Response:
        """Delete the queued jobs of one queue."""
        queue = form.get("queue", "")
        if not queue:
            return self.dashboard.error(request, 400, "which queue? (none given)")
        deleted = await self.dashboard.read(lambda c: data.purge(c, queue))
        return _back(self.dashboard, request, form, "purged", queue=queue, n=deleted)

    @_action
    async def bulk(self, request: Request, form: dict[str, str]) -> Response:
        """Retry or cancel (a batch of) the jobs the list's filters match."""
        action = form.get("action", "")
        if action not in ("retry", "cancel"):
            return self.dashboard.error(request, 400, f"unknown bulk action {action!r}")
        filters = _filters(form)
        changed, selected = await self.dashboard.read(lambda c: data.bulk(c, action, filters))
        return _back(self.dashboard, request, form, f"bulk-{action}", changed=changed,
                     selected=selected)

    async def login(self, request: Request) -> Response:
        """The token login form; a right token sets a session cookie."""
        dashboard = self.dashboard
        request.state.identity = None
        if request.method == "GET" or not dashboard.config.tokens:
            return dashboard.render(request, "login.html")
        address = dashboard.client_address(request)
        wait = dashboard.throttle.retry_after(address)
        if wait > 0:  # before reading the form: no token is checked while locked out
            return dashboard.too_many(wait)
        form = _form(await request.body())
        if not dashboard.check_csrf(request, form):
            return dashboard.error(request, 403, "CSRF check failed: reload the page")
        token = form.get("token", "")
        if not any(hmac.compare_digest(t.encode(), token.encode())
                   for t in dashboard.config.tokens):
            dashboard.throttle.failed(address)
            return dashboard.render(request, "login.html", status=401, failed=True)
        dashboard.throttle.succeeded(address)
        response = RedirectResponse(f"{base_path(request)}/", status_code=303)
        dashboard.set_cookie(request, response, SESSION_COOKIE, dashboard.sessions.create())
        return response

    @_guarded
    async def logout(self, request: Request) -> Response:
        """End the session (server-side: a copy of its cookie no longer works either)."""
        dashboard = self.dashboard
        form = _form(await request.body())
        if not dashboard.check_csrf(request, form):
            return dashboard.error(request, 403, "CSRF check failed")
        dashboard.sessions.end(dashboard.cookie(request, SESSION_COOKIE))
        response = RedirectResponse(f"{base_path(request)}/login", status_code=303)
        dashboard.delete_cookie(request, response, SESSION_COOKIE)
        return response

    @_guarded
    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics, when ``akadze_core.ops.metrics`` is installed (404 otherwise)."""
        try:
            from ..ops import metrics
        except ImportError:
            return PlainTextResponse("metrics are not available in this build",
                                     status_code=404)
        body, content_type = await metrics.render_metrics(self.dashboard.app)
        return Response(body, media_type=content_type)

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers (no database call)."""
        return PlainTextResponse("ok")


__all__ = ["Dashboard", "DashboardConfig", "create_app"]
