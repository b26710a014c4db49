"""The dashboard's web application (Starlette) and its server (uvicorn).

Routes (GET only): ``/`` policies, ``/policies/{id}`` one policy,
``/budget`` budget, ``/static/dashboard.css``; JSON API: ``/api/policies``,
``/api/policies/{id}/report`` (exactly `fedldp report --format json`, same
query options: window, consistency, confidence, simultaneous, heavy_hitters),
``/api/budget``; ``/shuffle`` and ``/api/shuffle``: the analyzer's reports on shuffled
batches (`--shuffle-reports`, fedldp.aggregator.dashboard.shuffled).

Security: binds to loopback unless told otherwise; any other bind needs a
bearer token (compared in constant time, `hmac.compare_digest`), and the server
refuses to start without one. On loopback the Host header must name loopback
(DNS-rebinding defence). Every response carries a Content-Security-Policy that
allows no script at all and only same-origin styles and images, and
`nosniff`, `no-referrer`, `DENY` framing and `no-store` headers.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from decimal import Decimal
from typing import Any

import uvicorn
from fedldp.aggregator.dashboard import pages, shuffled
from fedldp.aggregator.dashboard.model import (
    BudgetView,
    Dashboard,
    Options,
    PurposeReservations,
    UnknownPolicyError,
    iso_utc,
)
from fedldp.aggregator.reports import InsufficientReportsError, ReportError
from fedldp.client.policy import VerifiedPolicy
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Sent with every response.
SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": (
        "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
#: Hosts a loopback-bound dashboard answers to.
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
#: Shortest bearer token accepted (characters).
MIN_TOKEN_CHARS = 20


class DashboardConfigError(Exception):
    """The dashboard refuses to start as configured (the message says why)."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class SecurityMiddleware:
    """Adds SECURITY_HEADERS; with a token, answers 401 unless `Authorization: Bearer` matches."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self.token = None if token is None else token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])]
                headers.extend((k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items())
                message["headers"] = headers
            await send(message)

        if self.token is not None and not self._authorized(scope):
            response = JSONResponse(
                {"error": "a bearer token is required (Authorization: Bearer TOKEN)"},
                status_code=401,
                headers={"www-authenticate": 'Bearer realm="fedldp-dashboard"'},
            )
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, given = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given, self.token)
        return False


def _options(request: Request) -> Options:
    q = request.query_params
    try:
        confidence = float(q.get("confidence", "0.95"))
    except ValueError:
        raise ValueError("confidence must be a number in (0, 1)") from None
    return Options(
        confidence=confidence,
        consistency=q.get("consistency", "none"),
        simultaneous=q.get("simultaneous", "") in ("1", "true", "yes"),
    )


def _window(request: Request) -> int | None:
    text = request.query_params.get("window")
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError("window must be a window start in epoch seconds") from None


def _policy_kind(policy: VerifiedPolicy) -> str:
    """The /api/policies "kind" of a policy: "multi", "open", "frequency" or "numeric"."""
    if policy.attributes is not None:
        return "multi"
    if policy.open_domain is not None:
        return "open"
    return "frequency" if policy.labels is not None else "numeric"


def _policies_json(dashboard: Dashboard) -> list[dict[str, Any]]:
    """The /api/policies body: one object per policy of the index page, decimals as text."""
    return [
        {
            "policy_id": s.policy.policy_id,
            "policy_version": s.policy.version,
            "metric": s.policy.metric_name,
            "kind": _policy_kind(s.policy),
            "mechanism": s.policy.mechanism.wire_id,
            "epsilon_per_report": str(s.policy.charge),
            "epsilon_cap": str(s.policy.epsilon_cap),
            "min_reports_for_release": s.policy.min_reports_for_release,
            "latest_window": s.latest_window,
            "latest_window_utc": (None if s.latest_window is None else iso_utc(s.latest_window)),
            "latest_window_reports": s.latest_n,
            "released": s.released,
        }
        for s in dashboard.index()
    ]


def _budget_json(view: BudgetView) -> dict[str, Any]:
    """The /api/budget body: spend per policy and window, central reservations per
    purpose, and those of each central ledger (`central_ledgers`); decimals as exact
    text, times also as ISO 8601 UTC."""

    def dec(x: Decimal) -> str:
        return str(x)

    return {
        "read_at": iso_utc(view.read_at),
        "policies": {
            pid: [
                {
                    "window_start": r.window_start,
                    "window_start_utc": iso_utc(r.window_start),
                    "reports": r.reports,
                    "subjects": r.subjects,
                    "epsilon_charged": dec(r.epsilon_charged),
                    "subjects_at_cap": r.at_cap,
                }
                for r in rows
            ]
            for pid, rows in view.policies.items()
        },
        "central_reservations": _reservations_json(view.reservations),
        "central_ledgers": [
            {"ledger": c.label, "central_reservations": _reservations_json(c.reservations)}
            for c in view.central
        ],
    }


def _reservations_json(rows: list[PurposeReservations]) -> list[dict[str, Any]]:
    """Central reservations per purpose as /api/budget returns them (ε as exact text)."""
    return [
        {
            "purpose": c.purpose,
            "open": c.open_count,
            "epsilon_reserved_open": str(c.open_epsilon),
            "settled": c.settled_count,
            "epsilon_spent_settled": str(c.settled_epsilon),
            "cancelled": c.cancelled_count,
        }
        for c in rows
    ]


def create_app(
    dashboard: Dashboard, *, token: str | None = None, loopback_only: bool = True
) -> ASGIApp:
    """The ASGI application over `dashboard`.

    `token`: when set, every request needs ``Authorization: Bearer <token>``.
    `loopback_only`: answer only requests whose Host header names loopback.
    """

    def now() -> int:
        return int(dashboard.clock())

    def html_error(status: int, message: str) -> HTMLResponse:
        return HTMLResponse(pages.error_page(status, message, read_at=now()), status_code=status)

    async def index(request: Request) -> Response:
        return HTMLResponse(pages.index_page(dashboard.index(), read_at=now()))

    async def policy(request: Request) -> Response:
        try:
            options = _options(request)
            p = dashboard.policy(request.path_params["policy_id"])
            windows = dashboard.window_reports(p.policy_id, options)
        except UnknownPolicyError as exc:
            return html_error(404, str(exc))
        except (ValueError, ReportError) as exc:
            return html_error(400, str(exc))
        return HTMLResponse(pages.policy_page(p, windows, options, read_at=now()))

    async def budget(request: Request) -> Response:
        view = dashboard.budget()
        return HTMLResponse(pages.budget_page(view, dashboard.policies))

    async def stylesheet(request: Request) -> Response:
        return Response(pages.STYLESHEET, media_type="text/css")

    async def api_policies(request: Request) -> Response:
        return JSONResponse(_policies_json(dashboard))

    async def api_report(request: Request) -> Response:
        try:
            data = dashboard.report(
                request.path_params["policy_id"],
                _window(request),
                _options(request),
                with_heavy_hitters=request.query_params.get("heavy_hitters", "")
                in ("1", "true", "yes"),
            )
        except UnknownPolicyError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except InsufficientReportsError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        except (ValueError, ReportError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(data)

    async def api_budget(request: Request) -> Response:
        return JSONResponse(_budget_json(dashboard.budget()))

    async def shuffle(request: Request) -> Response:
        found = _shuffled(dashboard)
        body = shuffled.shuffle_body(dashboard.shuffle_reports, *found)
        return HTMLResponse(pages.page("Shuffled batches", body, read_at=now()))

    async def api_shuffle(request: Request) -> Response:
        return JSONResponse(shuffled.shuffled_json(*_shuffled(dashboard)))

    routes = [
        Route("/", index),
        Route("/policies/{policy_id:str}", policy),
        Route("/budget", budget),
        Route("/static/dashboard.css", stylesheet),
        Route("/api/policies", api_policies),
        Route("/api/policies/{policy_id:str}/report", api_report),
        Route("/api/budget", api_budget),
        Route("/shuffle", shuffle),
        Route("/api/shuffle", api_shuffle),
    ]
    middleware = (
        [Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)] if loopback_only else []
    )
    app = Starlette(routes=routes, middleware=middleware)
    return SecurityMiddleware(app, token=token)


def _shuffled(
    dashboard: Dashboard,
) -> tuple[list[shuffled.ShuffledReport], list[tuple[str, str]]]:
    """The analyzer's reports in the dashboard's shuffle folder (none without one)."""
    if dashboard.shuffle_reports is None:
        return [], []
    return shuffled.read_shuffle_reports(dashboard.shuffle_reports, dashboard.policies)


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token, and a token shorter than MIN_TOKEN_CHARS."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise DashboardConfigError(
            f"the bearer token must have at least {MIN_TOKEN_CHARS} characters"
        )
    if not is_loopback(host) and token is None:
        raise DashboardConfigError(
            f"refusing to listen on {host}, which is not loopback, without a bearer token: "
            "pass --token-file (or set FEDLDP_DASHBOARD_TOKEN), or listen on 127.0.0.1"
        )


class DashboardServer:
    """uvicorn serving `dashboard` on (host, port); port 0 lets the OS pick.

    `start()` binds and serves in a background thread; `url` is then known;
    `stop()` shuts it down and closes the ledger. `serve_forever()` runs in the calling thread.
    """

    def __init__(
        self,
        dashboard: Dashboard,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
    ) -> None:
        check_bind(host, token)
        self.dashboard = dashboard
        self.host = host
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host.strip("[]"), port))
        self.socket.listen(128)  # connections queue from now on, before serving starts
        self.port = int(self.socket.getsockname()[1])
        app = create_app(dashboard, token=token, loopback_only=is_loopback(host))
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, log_level="warning", access_log=False, server_header=False, lifespan="off"
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL (http://host:port/)."""
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        """Serve until interrupted (Ctrl-C, SIGTERM)."""
        asyncio.run(self.server.serve(sockets=[self.socket]))

    def start(self) -> DashboardServer:
        """Serve in a daemon thread; return once the server is accepting connections."""
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])),
            name="fedldp-dashboard",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise DashboardConfigError("the dashboard server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Shut down, wait for the server thread, close the dashboard's ledger."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()
        self.dashboard.close()
