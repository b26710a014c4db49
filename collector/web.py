"""The browser-reachable endpoint: the Connect protocol and gRPC-Web (and gRPC) over
HTTP/1.1 and HTTP/2, beside the gRPC server, on `web_listen` (off by default).

Library: connect-python (the connectrpc project's Python implementation, ASGI,
verified against the Connect conformance suite, on Google's protobuf runtime like
the rest of fedldp) served by Hypercorn (HTTP/1.1, h2c and HTTP/2 over TLS with
ALPN). sonora (gRPC-Web only, last release 2023, pins urllib3 < 2) and connectrpc
>= 0.10 (a protobuf runtime of its own, not Google's) were not taken.

Nothing of the Collector RPCs is implemented here a second time: every call goes
through `CollectorServicer.handle_async` — the same authentication (bearer token
from the `authorization` header), rate limit, admission (RPC slot and byte
budgets, the connection being the HTTP client's address), body deadline, parse,
service, group committer, ledger, metrics and refusal log as a gRPC call, on the
same event loop (so `server = "asyncio"` is required). A refusal has the same
code and message as over gRPC and its `retry-after-ms` as a trailer (a
`trailer-retry-after-ms` header in the Connect protocol), exposed to pages by CORS.

The protocol library reads a request's body before the handler runs, so the
gate admits each call first (`CollectorServicer.admit_async`: authentication,
rate limit, RPC slot, and its Content-Length, else `max_message_bytes`, reserved
under the same byte budgets), before a byte of its body is read; a refused call
is never read. An admitted body is read within `body_timeout_ms`, at most its
Content-Length (else `max_message_bytes` and a frame's prefix), and its gRPC-Web
framing checked before the library sees it;
`handle_async` takes the gate's admission (no second reservation), and the gate
gives back whatever is left when the call ends. Bad protocol headers (a
malformed `grpc-timeout`, any compression) are refused before authentication.
Only protobuf bodies are accepted (no JSON).
CORS: the origins in `web_allowed_origins` get the CORS headers; a request that
carries any other `Origin` is refused with 403 before anything is read.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from fedldp.collector.config import CollectorConfig, split_address
from fedldp.collector.errors import MalformedRequestError

#: The RPC paths' prefix (the same service name as over gRPC).
SERVICE = "fedldp.v1.Collector"

#: Content types accepted (protobuf only: the handler takes the raw message bytes).
PROTO_CONTENT_TYPES = (
    "application/proto",
    "application/connect+proto",
    "application/grpc-web+proto",
    "application/grpc-web",
    "application/grpc",
    "application/grpc+proto",
)

#: Request headers a page may send (the Connect and gRPC-Web clients' own).
ALLOWED_HEADERS = (
    "authorization",
    "content-type",
    "connect-protocol-version",
    "connect-timeout-ms",
    "grpc-timeout",
    "x-grpc-web",
    "x-user-agent",
)

#: Response headers a page may read (the status and the retry hint).
EXPOSED_HEADERS = (
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "retry-after-ms",
    "trailer-retry-after-ms",
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class _Body:
    """What the gate saw of one request (shared with its handler): a protocol
    refusal decided before admission (`refusal`: Connect code name and message),
    the admission ticket, and why its body was not handed over as it came."""

    peer: str
    refusal: tuple[str, str] | None = None
    ticket: Any = None
    timed_out: bool = False
    too_large: bool = False
    malformed: str | None = None


_BODY: contextvars.ContextVar[_Body] = contextvars.ContextVar("fedldp_web_body")


class _RawMessage:
    """The message type the protocol library parses into and serializes from: the
    raw bytes, unparsed (the servicer parses them after admission)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def ParseFromString(self, data: bytes | bytearray) -> None:  # noqa: N802 - protobuf's name
        """Keep `data` as is."""
        self.data = bytes(data)

    def SerializeToString(self, **_options: Any) -> bytes:  # noqa: N802 - protobuf's name
        """The bytes kept."""
        return self.data


def connect_code(code: grpc.StatusCode) -> Any:
    """The Connect code of a gRPC status code (same name; CANCELLED is CANCELED)."""
    from connectrpc.code import Code

    return Code.CANCELED if code == grpc.StatusCode.CANCELLED else Code[code.name]


class WebCall:
    """The part of a grpc.aio ServicerContext that `CollectorServicer` uses, for one
    web request: its headers as call metadata, its HTTP client as the peer, its
    (already buffered) body as the one message; `abort` raises the ConnectError the
    protocol library sends, with the trailers."""

    def __init__(self, ctx: Any, body: bytes, state: _Body) -> None:
        self.ctx = ctx
        self.body = body
        self.state = state
        #: the gate's admission (`CollectorServicer.admit_async`), taken before the body was read
        self.ticket = state.ticket

    def peer(self) -> str:
        """The connection, for its byte budget: the HTTP client's address and port."""
        return self.state.peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The request headers (lower-case names), as gRPC call metadata."""
        return tuple((k.lower(), v) for k, v in self.ctx.request_headers().allitems())

    def auth_context(self) -> dict[str, Any]:
        """No client certificates on the web endpoint."""
        return {}

    def time_remaining(self) -> float | None:
        """Seconds left before the request's own timeout (Connect-Timeout-Ms or
        grpc-timeout), None when it set none; a held share refusal is answered
        within half of it (`CollectorServicer._tarpit_for`)."""
        remaining_ms: float | None = self.ctx.timeout_ms()
        return None if remaining_ms is None else max(0.0, remaining_ms / 1000)

    async def read(self) -> bytes:
        """The request message; TimeoutError when its body did not come in time."""
        if self.state.timed_out:
            raise TimeoutError("the request body did not arrive in time")
        if self.state.malformed is not None:
            raise MalformedRequestError(self.state.malformed)
        return self.body

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: tuple[tuple[str, str], ...] = (),
    ) -> NoReturn:
        """End the call with `code` and `details`; `trailing_metadata` as trailers."""
        from connectrpc.errors import ConnectError

        for key, value in trailing_metadata:
            self.ctx.response_trailers()[key] = value
        raise ConnectError(connect_code(code), details)


def _endpoints(servicer: Any, max_message_bytes: int) -> dict[str, Any]:
    """The three Collector methods as connect-python endpoints around
    `servicer.handle_async` (raw bytes in, raw bytes out)."""
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from connectrpc.method import IdempotencyLevel, MethodInfo
    from connectrpc.server import Endpoint

    def endpoint(name: str) -> Any:
        async def function(request: _RawMessage, ctx: Any) -> _RawMessage:
            state = _BODY.get()
            if state.refusal is not None:
                raise ConnectError(Code[state.refusal[0]], state.refusal[1])
            if state.too_large:
                raise ConnectError(
                    Code.RESOURCE_EXHAUSTED,
                    f"the request is larger than max_message_bytes ({max_message_bytes})",
                )
            out = await servicer.handle_async(name, WebCall(ctx, request.data, state))
            return _RawMessage(out)

        info = MethodInfo(
            name=name,
            service_name=SERVICE,
            input=_RawMessage,
            output=_RawMessage,
            idempotency_level=IdempotencyLevel.UNKNOWN,
        )
        return Endpoint.unary(method=info, function=function)

    return {f"/{SERVICE}/{name}": endpoint(name) for name in ("Submit", "GetPolicies", "GetBudget")}


def _frame_error(body: bytes) -> str | None:
    """Why `body` is not exactly one uncompressed gRPC(-Web) message frame (a flag
    byte 0, a 4-byte big-endian length, that many bytes), or None when it is."""
    if len(body) < 5:
        return "the request is not a gRPC-Web message frame (truncated prefix)"
    if body[0] == 1:
        return "the request frame is flagged compressed but no grpc-encoding was sent"
    if body[0] != 0:
        return "the request frame is not a message frame (a trailer or unknown flag)"
    if int.from_bytes(body[1:5], "big") != len(body) - 5:
        return "the request frame's length does not match its body (truncated or trailing bytes)"
    return None


def _admitting_receive(
    receive: Receive,
    state: _Body,
    admit: Callable[[int], Awaitable[Any]],
    limits: tuple[int, int | None, float],
    *,
    framed: bool,
) -> Receive:
    """`receive` that, on its first call, admits the request before reading a byte
    of its body — `admit(n)` authenticates and reserves `n` bytes (its
    Content-Length, else `limit`, less a gRPC frame's 5-byte prefix when that
    would pass `max_message_bytes`) — then reads the whole body (at most its
    Content-Length, else `limit`, within `timeout` s from admission) and hands it
    over as one message.
    A refused request is not read; a body that is too large, too slow or (framed)
    not one message frame is replaced by an empty request (an empty frame when
    gRPC-framed) and `state` says why, so that the handler refuses it (the
    protocol library never sees such a body). `limits`: (limit, Content-Length or
    None, timeout)."""
    limit, length, timeout = limits
    done = False
    empty = b"\0\0\0\0\0" if framed else b""

    async def read_all(allowed: int) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        chunks: list[bytes] = []
        seen = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                state.timed_out = True
                break
            if message["type"] != "http.request":
                break  # http.disconnect: the library notices on its next receive
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > allowed:
                state.too_large = True
                break
            chunks.append(chunk)
            if not message.get("more_body", False):
                body = b"".join(chunks)
                state.malformed = _frame_error(body) if framed else None
                return empty if state.malformed else body
        return empty

    async def admitting() -> Message:
        nonlocal done
        if done:
            return await receive()
        done = True
        if state.refusal is not None:
            return {"type": "http.request", "body": empty, "more_body": False}
        if length is not None and length > limit:
            state.too_large = True
            return {"type": "http.request", "body": empty, "more_body": False}
        allowed = limit if length is None else length
        # at most max_message_bytes, as a gRPC call (a frame's 5-byte prefix unreserved)
        state.ticket = await admit(min(allowed, limit - len(empty)))
        if state.ticket.refusal is not None:
            return {"type": "http.request", "body": empty, "more_body": False}
        return {"type": "http.request", "body": await read_all(allowed), "more_body": False}

    return admitting


class WebApp:
    """The ASGI application: the origin gate, protobuf only, the body limits, CORS
    (Starlette's middleware) and the Connect/gRPC-Web endpoints."""

    def __init__(
        self,
        servicer: Any,
        *,
        allowed_origins: tuple[str, ...],
        max_message_bytes: int,
        body_timeout: float,
    ) -> None:
        from connectrpc.server import ConnectASGIApplication
        from starlette.middleware.cors import CORSMiddleware

        class _Collector(ConnectASGIApplication[Any]):
            @property
            def path(self) -> str:
                return f"/{SERVICE}"

        endpoints = _endpoints(servicer, max_message_bytes)
        inner = _Collector(service=servicer, endpoints=lambda _s: endpoints, compressions=())
        self.servicer = servicer
        self.allowed_origins = allowed_origins
        self.max_message_bytes = max_message_bytes
        self.body_timeout = body_timeout
        self.app = CORSMiddleware(
            self._gate(inner),
            allow_origins=list(allowed_origins),
            allow_methods=["POST"],
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )

    def _gate(self, inner: Any) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        async def gate(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await inner(scope, receive, send)
                return
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            origin = headers.get("origin")
            if origin is not None and origin not in self.allowed_origins:
                return await _plain(send, 403, b"origin not allowed\n")
            content_type = headers.get("content-type", "").split(";")[0].strip().lower()
            if scope["method"] != "POST" or content_type not in PROTO_CONTENT_TYPES:
                return await _plain(send, 415, b"POST with a protobuf content type only\n")
            framed = content_type.startswith("application/grpc")
            try:
                length = int(headers["content-length"]) if "content-length" in headers else None
            except ValueError:
                return await _plain(send, 400, b"invalid content-length\n")
            client = scope.get("client")
            state = _Body(peer=f"web:{client[0]}:{client[1]}" if client else "web:unknown")
            state.refusal = _protocol_refusal(headers, framed=framed)
            if state.refusal is not None:  # answered by the library without its header
                scope = dict(scope, headers=_without(scope["headers"], _REFUSED_HEADERS))
            call = _GateCall(scope["headers"], state.peer)

            async def admit(reserve: int) -> Any:
                return await self.servicer.admit_async(call, reserve)

            limit = self.max_message_bytes + (5 if framed else 0)  # a gRPC frame's prefix
            limited = _admitting_receive(
                receive, state, admit, (limit, length, self.body_timeout), framed=framed
            )
            token = _BODY.set(state)
            try:
                await inner(scope, limited, send)
            finally:
                _BODY.reset(token)
                if state.ticket is not None:
                    state.ticket.refusal = None
                    self.servicer.settle(state.ticket)

        return gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        await self.app(scope, receive, send)


#: Headers a request refused by `_protocol_refusal` is passed on without.
_REFUSED_HEADERS = frozenset(
    {b"grpc-timeout", b"grpc-encoding", b"content-encoding", b"connect-content-encoding"}
)

#: A valid grpc-timeout: at most 8 digits and a unit (gRPC over HTTP/2, "Timeout").
_GRPC_TIMEOUT = re.compile(r"[0-9]{1,8}[HMSmun]")


def _protocol_refusal(headers: dict[str, str], *, framed: bool) -> tuple[str, str] | None:
    """The refusal (Connect code name, message) of a request whose protocol headers
    are wrong, decided before authentication and admission (nothing is read or
    charged): a malformed `grpc-timeout` is INVALID_ARGUMENT, a compressed body
    (any encoding but identity; none is supported) UNIMPLEMENTED; None when fine."""
    timeout = headers.get("grpc-timeout")
    if framed and timeout is not None and not _GRPC_TIMEOUT.fullmatch(timeout):
        return "INVALID_ARGUMENT", "the grpc-timeout header is malformed"
    names = ("grpc-encoding",) if framed else ("content-encoding", "connect-content-encoding")
    for name in names:
        if headers.get(name, "identity").strip().lower() != "identity":
            return "UNIMPLEMENTED", f"{name} is not supported (no compression): send identity"
    return None


def _without(raw: list[tuple[bytes, bytes]], names: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """ASGI headers `raw` less those named in `names` (lower case)."""
    return [(k, v) for k, v in raw if k.lower() not in names]


class _GateCall:
    """The call as the gate sees it before its body is read, for
    `CollectorServicer.admit_async`: its headers as call metadata and its peer."""

    def __init__(self, raw: list[tuple[bytes, bytes]], peer: str) -> None:
        self.metadata = tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw)
        self._peer = peer

    def peer(self) -> str:
        """The connection (the HTTP client's address and port)."""
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The request headers (lower-case names), as gRPC call metadata."""
        return self.metadata

    def auth_context(self) -> dict[str, Any]:
        """No client certificates on the web endpoint."""
        return {}


async def _plain(send: Send, status: int, body: bytes) -> None:
    """A plain-text HTTP answer (refusals before the protocol is known)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def bind_socket(listen: str, *, reuse_port: bool) -> socket.socket:
    """A listening TCP socket on `listen` (SO_REUSEPORT when several collector
    processes share the port); OSError when it cannot be bound."""
    host, port = split_address(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


class WebEndpoint:
    """The web endpoint served by Hypercorn on `loop` (the asyncio gRPC server's)."""

    def __init__(self, config: CollectorConfig, servicer: Any, loop: asyncio.AbstractEventLoop):
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        app = WebApp(
            servicer,
            allowed_origins=config.web_allowed_origins,
            max_message_bytes=config.max_message_bytes,
            body_timeout=config.body_timeout_ms / 1000,
        )
        hc = Config()
        hc.accesslog = None
        hc.errorlog = None
        hc.h11_max_incomplete_size = 16 * 1024
        hc.keep_alive_timeout = 30
        hc.graceful_timeout = max(1.0, config.drain_seconds)
        if config.tls_cert:
            hc.certfile, hc.keyfile = config.tls_cert, config.tls_key
            hc.create_ssl_context()  # unreadable or mismatched files: raised here, not later
        sock = bind_socket(config.web_listen, reuse_port=config.reuse_port)
        self.port: int = sock.getsockname()[1]
        hc.bind = [f"fd://{sock.detach()}"]
        self.loop = loop
        self._stop = asyncio.Event()

        async def run() -> None:
            await serve(app, hc, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        self.task = asyncio.run_coroutine_threadsafe(run(), loop)

    def stop(self) -> None:
        """Stop accepting, let requests in progress finish (Hypercorn's grace)."""
        self.loop.call_soon_threadsafe(self._stop.set)
        self.task.result(timeout=60)
