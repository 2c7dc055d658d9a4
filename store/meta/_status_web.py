"""The status page over HTTP (``graben meta serve --status HOST:PORT``): read-only, behind
the API's tokens.

Paths: ``/`` (the page), ``/status.json`` (the same figures, ``View`` as JSON),
``/logout`` (forgets the cookie). Only GET and HEAD; anything else is 501.

A request carries a token in its ``Authorization: Bearer TOKEN`` header, or
once as ``?token=TOKEN``: the token is checked, kept in a cookie (HttpOnly,
SameSite=Strict: no script reads it, no other site's page sends it) and the
browser is sent to the same path without it, so it stays in no address bar or
history. The token is the API's: the cluster's (``graben token cluster``) sees
everything, a tenant's sees its own (``_status``); no token, or one the
service refuses, is a 401 page saying how to pass one. Every response forbids
scripts, frames and caching (``SECURITY``).

The HTTP server runs on threads of its own (``http.server``); each request's
figures are gathered on the service's event loop (``run_coroutine_threadsafe``),
so nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import http.cookies
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import msgspec

from .._errors import GrabenError, PermissionDenied, Unavailable
from ._status import Status
from ._status_html import refused, render

if TYPE_CHECKING:
    from ._service import MetaService

log = logging.getLogger("graben.meta")
COOKIE = "graben_token"
ANSWER_S = 30.0
"""Seconds a page's figures may take before it is a 503."""
SECURITY = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""Headers on every response."""
PAGES = {"/": "text/html; charset=utf-8", "/status.json": "application/json"}


class StatusPage:
    """One service's status page. Call order: ``start`` on the service's event loop, once
    the service has started; ``close`` before the service closes."""

    def __init__(
        self, service: MetaService, *, secret: bytes, agents: tuple[str, ...] = ()
    ) -> None:
        """``agents``: the memory agents (``HOST:PORT``) to ask for checkpoint jobs."""
        self.status = Status(service, secret=secret, agents=agents)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.address = ""
        """``HOST:PORT`` it serves on, once started."""

    async def start(self, host: str, port: int) -> str:
        """Serve on ``host:port`` (port 0: any free one); the address bound. A port that
        cannot be had is ``Unavailable``."""
        handler = _handler(self.status, asyncio.get_running_loop())
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_type = type("Server", (ThreadingHTTPServer,), {"address_family": family})
        try:
            self._server = server_type((host, port), handler)
        except OSError as exc:
            raise Unavailable(
                f"cannot serve the status page on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self.status.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="graben-status", daemon=True
        )
        self._thread.start()
        self.address = f"{host}:{self._server.server_address[1]}"
        log.info("status page at http://%s/", self.address)
        return self.address

    async def close(self) -> None:
        """Stop serving (a page in flight finishes first, or fails as the loop stops)."""
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        await self.status.close()


def _handler(status: Status, loop: asyncio.AbstractEventLoop) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.status, Handler.loop = status, loop
    return Handler


class _Handler(BaseHTTPRequestHandler):
    """One request: its token found, its figures asked of the loop, answered."""

    status: Status
    loop: asyncio.AbstractEventLoop
    server_version = "graben-status"
    timeout = ANSWER_S  # a connection that sends nothing holds its thread no longer

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        where = urlsplit(self.path)
        if where.path == "/logout":
            self._send(303, "", "text/plain", Location="/", **{"Set-Cookie": _cookie("")})
            return
        if where.path not in PAGES:
            self._send(404, refused(f"no page at {where.path}", status=404))
            return
        token, how = self._token(where.query)
        if not token:
            self._refuse("no token", how)
            return
        asked = asyncio.run_coroutine_threadsafe(self.status.view(token), self.loop)
        try:
            view = asked.result(ANSWER_S)
        except PermissionDenied as exc:
            self._refuse(exc.message, how)
            return
        except (GrabenError, TimeoutError) as exc:
            asked.cancel()
            self._send(503, refused(f"the service cannot say now: {exc}", status=503))
            return
        if how == "query":  # kept in the cookie, and taken out of the address
            self._send(303, "", "text/plain", Location=where.path, **{"Set-Cookie": _cookie(token)})
        elif where.path == "/":
            self._send(200, render(view))
        else:
            self._send(200, msgspec.json.encode(view).decode(), PAGES["/status.json"])

    def _token(self, query: str) -> tuple[str, str]:
        """The request's token and where it came from: ``header``, ``query`` or
        ``cookie`` (``("", "")``: none)."""
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given.strip():
            return given.strip(), "header"
        if token := parse_qs(query).get("token", [""])[0].strip():
            return token, "query"
        try:
            jar = http.cookies.SimpleCookie(self.headers.get("Cookie", ""))
        except http.cookies.CookieError:
            return "", ""
        kept = jar.get(COOKIE)
        return (kept.value, "cookie") if kept is not None and kept.value else ("", "")

    def _refuse(self, reason: str, how: str) -> None:
        forget = {"Set-Cookie": _cookie("")} if how == "cookie" else {}
        self._send(401, refused(reason), **{"WWW-Authenticate": 'Bearer realm="graben"'}, **forget)

    def _send(self, code: int, body: str, kind: str = PAGES["/"], **headers: str) -> None:
        data = body.encode()
        self.send_response(code)
        for name, value in {**SECURITY, "Content-Type": kind, **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("status page: %s " + format, self.address_string(), *args)


def _cookie(token: str) -> str:
    """The cookie holding ``token`` (``""``: one that makes the browser forget it)."""
    life = "" if token else "; Max-Age=0"
    return f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/{life}"
