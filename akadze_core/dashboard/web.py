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
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlencode

import psycopg
import psycopg_pool
from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import lookup
from ..dsn import redact_password
from ..jobs import JOB_STATES
from ..task_ids import TaskIds
from . import charts, data

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.dashboard")
T = TypeVar("T")

CSRF_COOKIE = "akadze_csrf"
SESSION_COOKIE = "akadze_session"
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
    credentials.
    """

    basic_auth: Mapping[str, str] = field(default_factory=dict)
    tokens: Sequence[str] = ()
    authorize: Callable[[Request], bool] | None = None
    read_only: bool = False
    title: str = "akadze"
    page_size: int = 50

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
        # Signs the session cookie; per process: a restart logs token sessions out.
        self._secret = secrets.token_bytes(32)
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

    def _session_value(self, token: str) -> str:
        return hmac.new(self._secret, token.encode(), hashlib.sha256).hexdigest()

    def identify(self, request: Request) -> str | None:
        """Who the request is ("user NAME", "token", "parent"), or None."""
        config = self.config
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic" and config.basic_auth:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            expected = config.basic_auth.get(user)
            if expected is not None and hmac.compare_digest(expected.encode(), password.encode()):
                return f"user {user}"
        if scheme.lower() == "bearer" and any(
                hmac.compare_digest(token.encode(), value.strip().encode())
                for token in config.tokens):
            return "token"
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and any(hmac.compare_digest(self._session_value(token), cookie)
                          for token in config.tokens):
            return "token"
        if config.authorize is not None and config.authorize(request):
            return "parent"
        return None

    def can_act(self, identity: str | None) -> bool:
        """Whether actions are offered: not read-only, and the caller authenticated."""
        return not self.config.read_only and identity is not None

    def check_csrf(self, request: Request, form: Mapping[str, str]) -> bool:
        """The form's token matches the cookie (double submit), and a browser that says
        where the form came from says it came from here."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = form.get("csrf", "")
        if not cookie or not sent or not hmac.compare_digest(cookie, sent):
            return False
        if request.headers.get("sec-fetch-site") == "cross-site":
            return False
        origin = request.headers.get("origin")
        if origin and origin != "null":
            host = request.headers.get("host", "")
            return origin.split("://", 1)[-1] == host
        return True

    # --- responses --------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """A page from template ``name``, with the security headers and the CSRF cookie."""
        base = base_path(request)
        identity = getattr(request.state, "identity", None)
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        html = self.templates.get_template(name).render(
            base=base, config=self.config, identity=identity, can_act=self.can_act(identity),
            csrf=csrf, notice=request.query_params.get("notice"), states=JOB_STATES,
            path=request.url.path, query=request.url.query, **context)
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, path=base or "/", httponly=True,
                                samesite="strict", secure=request.url.scheme == "https")
        return response

    def error(self, request: Request, status: int, message: str) -> Response:
        """An error page with ``message`` (escaped like everything else)."""
        return self.render(request, "error.html", status=status, message=message)

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


def _back(request: Request, form: Mapping[str, str], notice: str) -> Response:
    """303 to the form's ``next`` (a path of this dashboard only) with a notice."""
    base = base_path(request)
    target = form.get("next", "")
    if not target.startswith(base + "/") or target.startswith("//") or "\\" in target:
        target = base + "/"
    separator = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{separator}{urlencode({'notice': notice})}",
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
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/bulk", pages.bulk, methods=["POST"], name="bulk"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/jobs/{job_id:int}/retry", pages.retry, methods=["POST"], name="retry"),
        Route("/jobs/{job_id:int}/cancel", pages.cancel, methods=["POST"], name="cancel"),
        Route("/queues/purge", pages.purge, methods=["POST"], name="purge"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Route("/metrics", pages.metrics, name="metrics"),
        Route("/healthz", pages.healthz, name="healthz"),
    ]
    web = Starlette(routes=routes)
    web.state.dashboard = dashboard
    return web


Handler = Callable[[Request], Any]


def _guarded(method: Callable[[Pages, Request], Any]) -> Callable[[Pages, Request], Any]:
    """A page: authenticates first (when credentials are configured) and turns database
    errors into a scrubbed 503 page."""
    async def wrapper(self: Pages, request: Request) -> Response:
        dashboard = self.dashboard
        # A parent's check may block (a Django ORM query): off the event loop.
        identity = (await run_in_threadpool(dashboard.identify, request)
                    if dashboard.config.authorize is not None else dashboard.identify(request))
        request.state.identity = identity
        if dashboard.config.has_credentials and identity is None:
            if dashboard.config.basic_auth:
                return PlainTextResponse(
                    "authentication required", status_code=401, headers={
                        **SECURITY_HEADERS, "WWW-Authenticate": 'Basic realm="akadze"'})
            if dashboard.config.tokens:
                return RedirectResponse(f"{base_path(request)}/login", status_code=303)
            return PlainTextResponse("forbidden", status_code=403, headers=SECURITY_HEADERS)
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
        before_text = params.get("before", "")
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
            bulk_limit=data.BULK_LIMIT, first_url=f"{base}/jobs?{urlencode(keep)}")

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
        return _back(request, form, f"job {job_id} requeued" if done else
                     f"job {job_id} was not requeued: only failed jobs can be")

    @_action
    async def cancel(self, request: Request, form: dict[str, str]) -> Response:
        """Cancel a queued job, or ask a running one to stop."""
        job_id = int(request.path_params["job_id"])
        done = await self.dashboard.read(lambda c: data.cancel(c, job_id))
        return _back(request, form, f"job {job_id}: cancel requested" if done else
                     f"job {job_id} was not cancelled: only queued or running jobs can be")

    @_action
    async def purge(self, request: Request, form: dict[str, str]) -> Response:
        """Delete the queued jobs of one queue."""
        queue = form.get("queue", "")
        if not queue:
            return self.dashboard.error(request, 400, "which queue? (none given)")
        deleted = await self.dashboard.read(lambda c: data.purge(c, queue))
        return _back(request, form, f"queue {queue} purged: {deleted} queued jobs deleted")

    @_action
    async def bulk(self, request: Request, form: dict[str, str]) -> Response:
        """Retry or cancel (a batch of) the jobs the list's filters match."""
        action = form.get("action", "")
        if action not in ("retry", "cancel"):
            return self.dashboard.error(request, 400, f"unknown bulk action {action!r}")
        filters = _filters(form)
        changed, selected = await self.dashboard.read(lambda c: data.bulk(c, action, filters))
        verb = "requeued" if action == "retry" else "cancel requested for"
        more = " (the first batch: run it again for more)" if selected >= data.BULK_LIMIT else ""
        return _back(request, form, f"bulk {action}: {verb} {changed} of {selected} "
                                    f"matching jobs{more}")

    async def login(self, request: Request) -> Response:
        """The token login form; a right token sets a session cookie."""
        dashboard = self.dashboard
        request.state.identity = None
        if request.method == "GET" or not dashboard.config.tokens:
            return dashboard.render(request, "login.html")
        form = _form(await request.body())
        if not dashboard.check_csrf(request, form):
            return dashboard.error(request, 403, "CSRF check failed: reload the page")
        token = form.get("token", "")
        if not any(hmac.compare_digest(t.encode(), token.encode())
                   for t in dashboard.config.tokens):
            return dashboard.render(request, "login.html", status=401, failed=True)
        base = base_path(request)
        response = RedirectResponse(f"{base}/", status_code=303)
        response.set_cookie(SESSION_COOKIE, dashboard._session_value(token), path=base or "/",
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    @_guarded
    async def logout(self, request: Request) -> Response:
        """Forget the session cookie."""
        form = _form(await request.body())
        if not self.dashboard.check_csrf(request, form):
            return self.dashboard.error(request, 403, "CSRF check failed")
        base = base_path(request)
        response = RedirectResponse(f"{base}/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=base or "/")
        return response

    @_guarded
    async def metrics(self, request: Request) -> Response:
        """Prometheus metrics, when ``akadze_core.metrics`` is installed (404 otherwise)."""
        try:
            from .. import metrics  # type: ignore[attr-defined]
        except ImportError:
            return PlainTextResponse("metrics are not available in this build",
                                     status_code=404)
        body, content_type = await metrics.render_metrics(self.dashboard.app)
        return Response(body, media_type=content_type)

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers (no database call)."""
        return PlainTextResponse("ok")


__all__ = ["Dashboard", "DashboardConfig", "create_app"]
