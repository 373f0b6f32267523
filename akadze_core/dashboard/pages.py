"""The dashboard's request handlers (``Pages``): its pages, the actions on jobs, workers
and queues, and the token login and logout. Each page authenticates through its
``Dashboard`` first; each action also needs actions allowed and a CSRF token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlencode

import psycopg
import psycopg_pool
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..model.errors import InvalidArgs
from ..model.jobs import JOB_STATES
from ..store import lookup
from . import charts, data
from .auth import SESSION_COOKIE
from .state import Dashboard, base_path

logger = logging.getLogger("akadze.dashboard")

#: Seconds between reloads of a jobs list that follows new jobs.
FOLLOW_REFRESH = 5


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
    async def pause(self, request: Request, form: dict[str, str]) -> Response:
        """Pause one queue for every worker."""
        return await self._set_paused(request, form, paused=True)

    @_action
    async def resume(self, request: Request, form: dict[str, str]) -> Response:
        """Resume one paused queue."""
        return await self._set_paused(request, form, paused=False)

    async def _set_paused(self, request: Request, form: dict[str, str], *,
                          paused: bool) -> Response:
        queue = form.get("queue", "")
        if not queue:
            return self.dashboard.error(request, 400, "which queue? (none given)")
        try:
            changed = await self.dashboard.read(lambda c: data.set_paused(c, queue, paused))
        except InvalidArgs as exc:
            return self.dashboard.error(request, 400, str(exc))
        code = ("paused" if paused else "resumed") if changed else \
            ("not-paused" if paused else "not-resumed")
        return _back(self.dashboard, request, form, code, queue=queue)

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

