"""The dashboard's CSRF, session, login-throttle, notice and body-size defences over HTTP,
against the real ``akadze dashboard`` command (and, for https, its ASGI app called
directly): a token from another session or a tossed cookie is refused, so are
``Origin: null`` and a fetch a browser calls cross-site or same-site; logging out ends the
session; wrong logins are throttled; a notice is only ever one of the dashboard's own; an
oversized body is refused before it is read."""

from __future__ import annotations

import asyncio
import base64
import http.cookies
import re
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from akadze_core.dashboard import create_app
from akadze_core.dashboard.web import LoginThrottle, Sessions
from tests.dashboard.support import Client, dashboard
from tests.dashboard.test_http import BASIC, wait_state

pytestmark = pytest.mark.slow

TOKEN = "tok-" + "s" * 24


def _failed_job(db: psycopg.Connection, queue: str = "default") -> int:
    return int(db.execute(
        "INSERT INTO akadze.jobs (task, queue, state, finished_at, errors) "
        "VALUES ('boom', %s, 'failed', now(), '[]') RETURNING id", (queue,)).fetchone()[0])


def _queued(db: psycopg.Connection, queue: str, count: int) -> None:
    db.execute("INSERT INTO akadze.jobs (task, queue) SELECT 'noop', %s "
               "FROM generate_series(1, %s)", (queue, count))


def _count(db: psycopg.Connection, queue: str) -> int:
    return int(db.execute("SELECT count(*) FROM akadze.jobs WHERE queue = %s AND state = "
                          "'queued'", (queue,)).fetchone()[0])


def _login(base: str) -> Client:
    client = Client()
    client.get(base + "/login")
    answer = client.post(base + "/login", {"csrf": client.csrf(), "token": TOKEN})
    assert answer.status == 200 and answer.url == base + "/", (answer.status, answer.url)
    return client


def test_token_is_bound_to_the_session_and_cross_site_requests_are_refused(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    failed = _failed_job(db)
    _queued(db, "keep", 3)
    with dashboard(database_url, tmp_path, "--token", TOKEN) as served:
        base = served.base
        alice, bob = _login(base), _login(base)
        alice.get(f"{base}/jobs/{failed}")
        bob.get(f"{base}/jobs/{failed}")
        assert alice.csrf() != bob.csrf()
        origin = base  # http://127.0.0.1:PORT
        other_port = f"http://127.0.0.1:{int(urlsplit(base).port or 0) + 1}"
        refused = [
            ({"csrf": alice.csrf()}, {}),  # a token of another session
            ({"csrf": bob.csrf()}, {"Origin": "null"}),  # a cross-site redirect
            ({"csrf": bob.csrf()}, {"Origin": other_port}),  # a sibling port
            ({"csrf": bob.csrf()}, {"Origin": "http://evil.example"}),
            ({"csrf": bob.csrf()}, {"Sec-Fetch-Site": "same-site"}),  # a sibling's page
            ({"csrf": bob.csrf()}, {"Sec-Fetch-Site": "cross-site"}),
            ({"csrf": bob.csrf(), "queue": "keep"}, {"Origin": origin,
                                                      "Sec-Fetch-Site": "same-site"}),
        ]
        for form, headers in refused:
            for path in (f"/jobs/{failed}/retry", "/queues/purge", "/queues/pause"):
                answer = bob.post(base + path, {"queue": "keep", **form}, headers=headers)
                assert answer.status == 403 and "CSRF" in answer.text, (path, form, headers)
        # Cookie tossing: a sibling sets the old double-submit cookie and sends its value.
        tossed = Client({"Cookie": f"akadze_session={bob.cookie('akadze_session')}; "
                                   "akadze_csrf=tossed"})
        answer = tossed.post(base + "/queues/purge", {"csrf": "tossed", "queue": "keep"})
        assert answer.status == 403 and "CSRF" in answer.text
        assert wait_state(db, failed, "failed") == "failed" and _count(db, "keep") == 3
        assert db.execute("SELECT count(*) FROM akadze.queue_pauses").fetchone()[0] == 0
        # The right token from the page, same-origin: done.
        done = bob.post(f"{base}/jobs/{failed}/retry", {"csrf": bob.csrf()},
                        headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
        assert done.status == 200 and f"job {failed} requeued" in done.text
        assert wait_state(db, failed, "queued") == "queued"


def test_basic_auth_token_is_bound_to_the_credentials(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    _queued(db, "keep", 2)
    other = {"Authorization": "Basic " + base64.b64encode(b"ops:pw-ops").decode()}
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin,ops:pw-ops"
                   ) as served:
        admin, ops = Client(BASIC), Client(other)
        admin.get(served.base + "/")
        ops.get(served.base + "/")
        assert admin.csrf() != ops.csrf()
        for form, headers in (({"csrf": admin.csrf()}, {}),
                              ({"csrf": ops.csrf()}, {"Origin": "null"}),
                              ({"csrf": ops.csrf()}, {"Sec-Fetch-Site": "same-site"})):
            answer = ops.post(served.base + "/queues/purge", {"queue": "keep", **form},
                              headers=headers)
            assert answer.status == 403 and "CSRF" in answer.text, (form, headers)
        assert _count(db, "keep") == 2
        done = ops.post(served.base + "/queues/purge", {"queue": "keep", "csrf": ops.csrf()},
                        headers={"Origin": served.base, "Sec-Fetch-Site": "same-origin"})
        assert done.status == 200 and "queue keep purged: 2 queued jobs deleted" in done.text
        assert _count(db, "keep") == 0


def test_logout_ends_the_session_for_every_copy_of_its_cookie(
        database_url: str, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, "--token", TOKEN) as served:
        client = _login(served.base)
        session = client.cookie("akadze_session")
        assert session and TOKEN not in session
        copy = Client({"Cookie": f"akadze_session={session}"})
        assert copy.get(served.base + "/jobs").url == served.base + "/jobs"
        page = client.get(served.base + "/")
        assert 'action="/logout"' in page.text
        out = client.post(served.base + "/logout", {"csrf": client.csrf()})
        assert out.url == served.base + "/login"
        # The copy (a stolen cookie, or the one a shared browser kept) is logged out too.
        assert copy.get(served.base + "/jobs").url == served.base + "/login"


def test_wrong_logins_are_throttled_per_address(database_url: str, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, "--token", TOKEN, "--basic-auth",
                   "admin:pw-admin") as served:
        client = Client()
        client.get(served.base + "/login")
        for _ in range(5):
            answer = client.post(served.base + "/login", {"csrf": client.csrf(),
                                                          "token": "wrong"})
            assert answer.status == 401
        # Locked out: even the right token is not checked, and basic auth is locked too.
        locked = client.post(served.base + "/login", {"csrf": client.csrf(), "token": TOKEN})
        assert locked.status == 429 and "too many wrong logins" in locked.text
        wait = int(locked.headers["retry-after"])
        assert wait >= 1
        assert Client(BASIC).get(served.base + "/").status == 429
        wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}
        time.sleep(wait + 0.2)
        assert Client(wrong).get(served.base + "/").status == 401  # a 6th: locked 2 s
        answer = Client(BASIC).get(served.base + "/")
        assert answer.status == 429 and int(answer.headers["retry-after"]) == 2
        time.sleep(2.2)
        assert Client(BASIC).get(served.base + "/").status == 200  # a right login clears it
        assert Client(wrong).get(served.base + "/").status == 401


def test_a_notice_is_only_one_of_the_dashboards_own(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    _queued(db, "q1", 1)
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin") as served:
        client = Client(BASIC)
        for query in ("notice=Your+session+expired:+call+555-0100",
                      "notice=requeued&n-job=1", "notice=purged&n-queue=phish&n-n=9&ns=00"):
            page = client.get(f"{served.base}/?{query}")
            assert page.status == 200 and 'id="notice"' not in page.text, query
        done = client.post(served.base + "/queues/purge", {"queue": "q1", "csrf": client.csrf()})
        assert "queue q1 purged: 1 queued jobs deleted" in done.text
        # The same signed notice with another queue name shows nothing.
        forged = done.url.replace("n-queue=q1", "n-queue=phish")
        assert forged != done.url and 'id="notice"' not in client.get(forged).text


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]


def _answer_of(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def test_an_oversized_body_is_refused_before_it_is_read(
        database_url: str, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, "--token", TOKEN) as served:
        host, port = urlsplit(served.base).hostname, urlsplit(served.base).port
        pid = served.process.proc.pid
        before = _rss_kib(pid)
        megabyte = b"token=" + b"x" * (1024 * 1024 - 6)
        # A 200 MiB Content-Length: refused at once (only 8 MiB of it is even sent).
        for method, path in (("POST", "/login"), ("POST", "/queues/purge"), ("GET", "/jobs")):
            with socket.create_connection((host, port), timeout=10) as sock:
                started = time.monotonic()
                sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                             "Content-Type: application/x-www-form-urlencoded\r\n"
                             f"Content-Length: {200 * 1024 * 1024}\r\n\r\n".encode())
                try:
                    for _ in range(8):
                        sock.sendall(megabyte)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                answer = _answer_of(sock, 5)
                assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])
                assert time.monotonic() - started < 5
        # Chunked, no length: counted as it comes, refused once past the limit.
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(f"POST /login HTTP/1.1\r\nHost: {host}:{port}\r\n"
                         "Content-Type: application/x-www-form-urlencoded\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n".encode())
            sent = 0
            try:
                while sent < 200 * 1024 * 1024:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(megabyte), megabyte))
                    sent += len(megabyte)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = _answer_of(sock, 5)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        grown = (_rss_kib(pid) - before) / 1024
        assert grown < 30, f"the dashboard grew {grown:.0f} MiB"
        # A normal form still works.
        assert _login(served.base).get(served.base + "/jobs").status == 200


async def _asgi(app: Any, method: str, path: str, headers: dict[str, str],
                body: bytes = b"") -> tuple[int, list[tuple[str, str]], bytes]:
    """One request to the ASGI ``app`` over https (as behind a TLS proxy with forwarded
    headers applied): status, headers, body."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "https", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("dash.example", 443),
             "headers": [(key.lower().encode(), value.encode())
                         for key, value in {"host": "dash.example", **headers}.items()]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], [(k.decode(), v.decode()) for k, v in start["headers"]],
            b"".join(m.get("body", b"") for m in sent[1:]))


def test_https_cookies_are_host_prefixed_and_unprefixed_ones_ignored(
        database_url: str) -> None:
    web = create_app(database_url=database_url, tokens=[TOKEN])
    try:
        status, headers, body = asyncio.run(_asgi(web, "GET", "/login", {}))
        assert status == 200
        cookie = http.cookies.SimpleCookie()
        for key, value in headers:
            if key == "set-cookie":
                assert value.startswith("__Host-akadze_csrf="), value
                assert all(part in value for part in ("Path=/;", "Secure", "HttpOnly",
                                                      "SameSite=strict")), value
                cookie.load(value)
        browser = cookie["__Host-akadze_csrf"].value
        token = re.search(rb'name="csrf" value="([^"]+)"', body).group(1).decode()  # type: ignore[union-attr]
        form = f"csrf={token}&token={TOKEN}".encode()
        status, headers, _ = asyncio.run(_asgi(
            web, "POST", "/login", {"cookie": f"__Host-akadze_csrf={browser}",
                                    "content-type": "application/x-www-form-urlencoded",
                                    "origin": "https://dash.example"}, form))
        assert status == 303
        session = [value for key, value in headers if key == "set-cookie"]
        assert len(session) == 1 and session[0].startswith("__Host-akadze_session=")
        assert "Secure" in session[0] and "Path=/;" in session[0]
        # The same values under the unprefixed names (which a sibling could set) count
        # for nothing over https.
        status, _, _ = asyncio.run(_asgi(
            web, "POST", "/login", {"cookie": f"akadze_csrf={browser}",
                                    "content-type": "application/x-www-form-urlencoded"},
            form))
        assert status == 403
    finally:
        web.state.dashboard.close()


def test_sessions_end_and_the_throttle_forgets() -> None:
    sessions = Sessions(lifetime=0.3)
    first = sessions.create()
    assert sessions.valid(first) and not sessions.valid("") and not sessions.valid("x")
    time.sleep(0.4)
    assert not sessions.valid(first)  # past its lifetime
    capped = Sessions(lifetime=60, cap=3)
    made = [capped.create() for _ in range(4)]
    assert [capped.valid(one) for one in made] == [False, True, True, True]  # oldest ends
    capped.end(made[-1])
    assert not capped.valid(made[-1])
    throttle = LoginThrottle(free=2, longest=4, forget=0.3)
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert 0.5 < throttle.retry_after("10.0.0.1") <= 1  # the 2nd: 1 s
    assert throttle.retry_after("10.0.0.2") == 0  # per address
    throttle.succeeded("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0
    throttle.failed("10.0.0.3")
    time.sleep(0.4)  # forgotten: the next failure is a first one again
    throttle.failed("10.0.0.3")
    assert throttle.retry_after("10.0.0.3") == 0
