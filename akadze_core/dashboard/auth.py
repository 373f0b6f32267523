"""The dashboard's authentication pieces that hold no app: cookie names, security headers,
token-login sessions, the wrong-login throttle, the request-body limit and ``Caller``.

``Dashboard`` (``state.py``) puts them together: it checks credentials, signs and checks
CSRF tokens and admits requests.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

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
