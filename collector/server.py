"""The gRPC server: thin handlers around `CollectorService`, and its lifecycle.

Each handler: authenticate (subject from the token or client certificate, never
from the request; call metadata only) -> rate limit -> admission (an RPC slot
and room under the byte budgets, collector/admission.py) -> read the one
request message -> parse -> service call -> serialize. Nothing of a request's
body is read before it is admitted. Handlers take the request stream of raw
bytes (no gRPC-side deserializer): a truncated or garbage message gets
INVALID_ARGUMENT from `errors.STATUS`, not INTERNAL, and an unadmitted one is
never read.

Server choice: grpcio's asyncio server by default (one event-loop thread runs
every handler and the group committer resolves a whole group's futures with one
callback), the sync server (a thread pool) on request: see docs/collector.md
for the measurements. Durable throughput comes from the group committer either
way. The gRPC health service is not a Collector RPC (no slot, no byte budget);
`health_listen` serves it on a port of its own as well.

`start_collector(config)` runs a collector in-process (tests, the demo, the
daemon); `RunningCollector.stop(grace)` drains: health goes NOT_SERVING, new
RPCs are refused, in-flight ones finish (committing), then the committer and
the ledger close.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import sqlalchemy as sa
from fedldp.client.policy import PolicyError
from fedldp.collector.admission import Admission, RefusalHints, retry_after_ms
from fedldp.collector.auth import Authenticator, TokenAuthority
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.config import CollectorConfig, ConfigError
from fedldp.collector.errors import (
    BodyTimeoutError,
    CollectorError,
    MalformedRequestError,
    OverloadedError,
    RateLimitedError,
    SubjectShareError,
    UnauthenticatedError,
    status_of,
)
from fedldp.collector.ledger import Ledger
from fedldp.collector.ledger.shards import ShardedLedger
from fedldp.collector.logbudget import LogBudget
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.ratelimit import RateLimiter
from fedldp.collector.routing import (
    AnyLedger,
    ShardedCommitter,
    make_committer,
    open_collector_ledger,
)
from fedldp.collector.service import CollectorService, Limits
from fedldp.v1 import collector_pb2 as pb
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger("fedldp.collector")
health_aio = health.aio  # type: ignore[attr-defined]  # the asyncio health servicer

SERVICE_NAME = "fedldp.v1.Collector"


def _subject_tag(subject: str) -> str:
    """A short, stable, non-reversible tag for logs (never the subject itself)."""
    import hashlib

    return hashlib.sha256(subject.encode("utf-8")).hexdigest()[:12]


class RefusalLog:
    """Refused requests are counted in metrics; this keeps their log lines bounded.

    At most `lines` lines per `interval` seconds (each with the method, code, error
    and, where the subject is known, its tag); the refusals past that are counted
    and reported by one summary line (`refusals not logged`, with the count) when
    the next interval starts. A flood of refusals writes at most `lines` + 1 lines
    per interval.
    """

    def __init__(
        self,
        *,
        lines: int = 10,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = LogBudget(lines=lines, interval=interval, clock=clock)

    def refused(self, level: int, fields: dict[str, Any]) -> None:
        """Log one refusal (`fields`: its structured data), within the budget."""
        allowed, suppressed = self.budget.admit()
        if suppressed:
            log.warning(
                "refusals not logged",
                extra={"fields": {"count": suppressed, "seconds": self.budget.interval}},
            )
        if allowed:
            log.log(level, "request refused", extra={"fields": fields})


#: Log level of each kind of refusal (others: WARNING).
_REFUSAL_LEVEL: dict[type[CollectorError], int] = {
    UnauthenticatedError: logging.INFO,
    RateLimitedError: logging.INFO,
    OverloadedError: logging.INFO,
    BodyTimeoutError: logging.INFO,
    SubjectShareError: logging.INFO,
}

#: Both servers answer a refusal for a subject's full share after its retry hint,
#: for at most this many calls at a time per process (beyond: at once). The sync
#: server has this many threads more than its `workers` for them.
TARPIT_MAX_CALLS = 256
#: ... and for at most this many seconds (the hint may be longer: the device is
#: told to wait the rest) and half the time left to the call's own deadline.
TARPIT_MAX_SECONDS = 2.0

#: What the sync server's timed read uses of grpcio's request iterator
#: (`grpc._server._RequestIterator`, grpcio pinned in constraints.txt):
#: tests/collector/test_stalled_bodies.py fails if grpcio changes them.
_SYNC_ITERATOR_PARTS = ("_state", "_raise_or_start_receive_message", "_look_for_request")


def next_within(requests: Iterator[bytes], timeout: float) -> bytes | None:
    """The next message of a sync-server request stream, waiting at most `timeout` s
    for it; None at the end of the stream; TimeoutError when it did not come in time.

    grpcio's request iterator has no timed read, and a handler thread blocked in
    `next()` holds its admission reservation for as long as the client withholds
    the body. This runs the iterator's own read (start one receive, wait on the
    call's condition until the message or the end of the stream is there) with a
    deadline. After a timeout the receive stays pending until the call ends (the
    refusal's status ends it) and nothing of the call is read any more. Any other
    iterator (one without grpcio's parts) is read with plain `next`.
    """
    if not all(hasattr(requests, part) for part in _SYNC_ITERATOR_PARTS):
        return next(requests, None)
    it: Any = requests
    deadline = time.monotonic() + timeout
    with it._state.condition:
        try:
            it._raise_or_start_receive_message()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the request body did not arrive in time")
                it._state.condition.wait(remaining)
                request: bytes | None = it._look_for_request()
                if request is not None:
                    return request
        except StopIteration:
            return None


if sys.version_info >= (3, 11):

    async def read_within(context: Any, timeout: float) -> Any:
        """`await context.read()` on the asyncio server, at most `timeout` s
        (TimeoutError after it; the read is cancelled)."""
        async with asyncio.timeout(timeout):
            return await context.read()

else:  # pragma: no cover - Python 3.10

    async def read_within(context: Any, timeout: float) -> Any:
        """`await context.read()` on the asyncio server, at most `timeout` s
        (TimeoutError after it; the read is cancelled)."""
        try:
            return await asyncio.wait_for(context.read(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("the request body did not arrive in time") from None


@dataclass
class Admitted:
    """What admission took for one call on the asyncio server: its connection
    (`peer`), subject, RPC slot (`entered`), reserved bytes (`held`), or the
    refusal that ended it (`CollectorServicer.admit_async`)."""

    peer: str
    subject: str = ""
    entered: bool = False
    held: int = 0
    refusal: CollectorError | None = None


class CollectorServicer:
    """Handlers for the three Collector RPCs, taking the request stream unread.

    Each handler: authenticate (call metadata only) -> rate limit -> admission (an
    RPC slot, then room for the largest message under the byte budgets,
    collector/admission.py) -> read the one request message as raw bytes -> parse
    -> service call -> serialize. A request refused before the read was never
    buffered by the server beyond the transport's flow-control window. The read
    has a deadline (`body_timeout`): a request whose body does not come in time
    gives its reservation back and is refused (BodyTimeoutError:
    RESOURCE_EXHAUSTED with `retry-after-ms`), so a client that sends headers and
    withholds the body holds its subject's share of the byte budget for at most
    that long. Refusals
    are counted (`fedldp_collector_refusals_total{error}`) and logged within
    `RefusalLog`'s budget; the status is sent after leaving the `except` block, so
    no exception keeps the request's frames (and bytes) alive in a cycle.
    """

    def __init__(
        self,
        service: CollectorService,
        authenticator: Authenticator,
        limiter: RateLimiter,
        metrics: CollectorMetrics,
        clock: Callable[[], int],
        *,
        admission: Admission,
        reserve_bytes: int,
        admission_wait: float,
        body_timeout: float = 5.0,
        refusal_log: RefusalLog | None = None,
        hints: RefusalHints | None = None,
    ) -> None:
        self.service = service
        self.authenticator = authenticator
        self.limiter = limiter
        self.metrics = metrics
        self.clock = clock
        self.admission = admission
        self.reserve_bytes = reserve_bytes
        self.admission_wait = admission_wait
        self.body_timeout = body_timeout
        self._tarpitted = 0  # share refusals waiting to be answered (`_tarpit_for`)
        self._tarpit_lock = threading.Lock()
        #: set when the server drains: held share refusals are answered at once
        self.draining = threading.Event()
        self.refusal_log = refusal_log or RefusalLog()
        #: growing retry hints for subjects refused for their own calls
        self.hints = hints or RefusalHints()
        self._request_children: dict[tuple[str, grpc.StatusCode], Any] = {}
        self._refusal_children: dict[str, Any] = {}
        self._methods: dict[str, Any] | None = None

    def _count(self, method: str, code: grpc.StatusCode) -> None:
        """Count one RPC by method and status (the labelled child is bound once)."""
        child = self._request_children.get((method, code))
        if child is None:
            child = self.metrics.requests.labels(method, code.name)
            self._request_children[(method, code)] = child
        child.inc()

    def _authenticate(self, context: Any) -> str:
        """The caller's subject, rate-limited; from the call metadata only."""
        auth_context = context.auth_context() if self.authenticator.mtls else {}
        subject = self.authenticator.subject_from(
            context.invocation_metadata() or (), auth_context, now=self.clock()
        )
        wait = self.limiter.acquire(subject)
        if wait > 0:
            self.metrics.rate_limited.inc()
            raise RateLimitedError(
                "too many requests for this subject; retry after the hint",
                metadata=(("retry-after-ms", str(max(1, int(wait * 1000 + 0.999)))),),
                subject=subject,
            )
        return subject

    def _overloaded(self, what: str) -> OverloadedError:
        """The refusal of a request the `what` limit sheds (counted by `what`)."""
        self.metrics.shed.labels(what).inc()
        return OverloadedError(
            f"the collector is at its limit of {what} in flight; retry after the hint",
            metadata=(("retry-after-ms", str(retry_after_ms())),),
        )

    def _no_room(self, subject: str, reserve: int | None = None) -> OverloadedError:
        """The refusal of a request that found no room for `reserve` bytes (default
        `reserve_bytes`) under the byte budgets: its subject's share (refused at
        once) or the server's or connection's budget."""
        n = self.reserve_bytes if reserve is None else reserve
        if not self.admission.only_subject_full(subject, n):
            return self._overloaded("request bytes")
        self.metrics.shed.labels("subject bytes").inc()
        return SubjectShareError(
            "this device already has its share of request bytes in flight "
            "(max_subject_inflight_bytes); retry after the hint",
            metadata=(("retry-after-ms", str(self.hints.refused(subject))),),
        )

    def _body_timed_out(self, subject: str) -> BodyTimeoutError:
        """The refusal of an admitted request whose body did not come in time (its
        hint grows with the subject's streak of such refusals: `RefusalHints`)."""
        self.metrics.shed.labels("body deadline").inc()
        return BodyTimeoutError(
            f"the request body did not arrive within {self.body_timeout:g} s "
            "(body_timeout_ms); retry after the hint",
            metadata=(("retry-after-ms", str(self.hints.refused(subject))),),
        )

    @staticmethod
    def _parse(request_type: type[Message], request_bytes: bytes | None) -> Message:
        if request_bytes is None:
            raise MalformedRequestError("the call carried no request message")
        try:
            return request_type.FromString(request_bytes)
        except DecodeError:
            raise MalformedRequestError(
                f"the request is not a valid {request_type.DESCRIPTOR.full_name}"
            ) from None

    def _read(
        self, request_type: type[Message], requests: Iterator[bytes], subject: str
    ) -> tuple[Message, bytes]:
        """The request message, parsed, and its bytes (kept by the call only while it
        is handled: dropped as soon as it returns or raises)."""
        try:
            request_bytes = next_within(requests, self.body_timeout)
        except TimeoutError:
            raise self._body_timed_out(subject) from None
        return self._parse(request_type, request_bytes), request_bytes or b""

    async def _aread(
        self, request_type: type[Message], context: Any, subject: str
    ) -> tuple[Message, bytes]:
        """`_read` on the asyncio server."""
        try:
            message = await read_within(context, self.body_timeout)
        except TimeoutError:
            raise self._body_timed_out(subject) from None
        request_bytes = None if message is grpc.aio.EOF else message  # type: ignore[attr-defined]
        return self._parse(request_type, request_bytes), request_bytes or b""

    def _refused(
        self, method: str, exc: CollectorError, subject: str
    ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
        """Count and (within the log budget) log a refusal; its status, detail and
        trailing metadata."""
        code = status_of(exc)
        name = type(exc).__name__
        child = self._refusal_children.get(name)
        if child is None:
            child = self._refusal_children[name] = self.metrics.refusals.labels(name)
        child.inc()
        subject = subject or exc.subject
        self.refusal_log.refused(
            _REFUSAL_LEVEL.get(type(exc), logging.WARNING),
            {
                "method": method,
                "code": code.name,
                "error": name,
                "subject_tag": _subject_tag(subject) if subject else None,
            },
        )
        return code, str(exc), exc.metadata

    def _call(
        self,
        method: str,
        request_type: type[Message],
        body: Callable[[str, Any, bytes], Message],
        requests: Iterator[bytes],
        context: grpc.ServicerContext,
    ) -> bytes:
        code = grpc.StatusCode.OK
        subject = ""
        peer = context.peer()
        admission = self.admission
        entered = False
        held = 0
        slow = False
        try:
            subject = self._authenticate(context)
            if not admission.enter():
                raise self._overloaded("requests")
            entered = True
            if not admission.reserve(
                peer, self.reserve_bytes, timeout=self.admission_wait, subject=subject
            ):
                raise self._no_room(subject)
            held = self.reserve_bytes
            request, raw = self._read(request_type, requests, subject)
            admission.resize(peer, held, len(raw), subject=subject)
            held = len(raw)
            # Handed over: the body holds the only reference to the request's bytes,
            # and drops it once it has read them (`CollectorService.submit`).
            box = [raw]
            del raw
            return body(subject, request, box.pop()).SerializeToString()
        except CollectorError as exc:
            code, detail, trailers = self._refused(method, exc, subject)
            slow = isinstance(exc, SubjectShareError)
        finally:
            admission.release(peer, held, subject=subject)
            if entered:
                admission.leave()
            self._count(method, code)
        # Outside the except block: the exception and its frames are gone already.
        if slow:
            wait = self._tarpit_for(trailers, context.time_remaining())
            if wait is not None:
                try:  # one of the TARPIT_MAX_CALLS threads beyond `workers`; a drain ends it
                    self.draining.wait(wait)
                finally:
                    self._tarpit_done()
        if trailers:
            context.set_trailing_metadata(trailers)
        context.abort(code, detail)
        raise AssertionError("unreachable: abort raises")

    async def _admit(self, context: Any, ticket: Admitted, reserve: int) -> None:
        """Authenticate, rate-limit, take an RPC slot and reserve `reserve` bytes for
        `ticket` (what it took is recorded in it as it is taken); CollectorError when
        refused (what was taken stays in `ticket` for the caller to give back)."""
        ticket.subject = self._authenticate(context)
        if not self.admission.enter():
            raise self._overloaded("requests")
        ticket.entered = True
        if not await self.admission.reserve_async(
            ticket.peer, reserve, timeout=self.admission_wait, subject=ticket.subject
        ):
            raise self._no_room(ticket.subject, reserve)
        ticket.held = reserve

    async def admit_async(self, context: Any, reserve: int) -> Admitted:
        """Admit a call before its body is read, for a transport that must read the
        body before `handle_async` runs (the web endpoint, collector/web.py): the same
        authentication, rate limit, RPC slot and byte budgets as `_acall`, reserving
        `reserve` bytes. A refusal is kept in the ticket (`refusal`) and raised by
        `handle_async` (counted, logged and answered as over gRPC); the caller hands
        the ticket to `handle_async` as `context.ticket` and calls `settle` when the
        call ends, in case `handle_async` never ran."""
        ticket = Admitted(peer=context.peer())
        try:
            await self._admit(context, ticket, reserve)
        except CollectorError as exc:
            ticket.refusal = exc
        except BaseException:  # cancelled (the client went away): nothing may stay taken
            self.settle(ticket)
            raise
        return ticket

    def settle(self, ticket: Admitted) -> None:
        """Give back whatever `ticket` still holds (nothing once `handle_async` ran)."""
        self.admission.release(ticket.peer, ticket.held, subject=ticket.subject)
        ticket.held = 0
        if ticket.entered:
            ticket.entered = False
            self.admission.leave()

    async def _acall(
        self,
        method: str,
        request_type: type[Message],
        body: Callable[[str, Any, bytes], Awaitable[Message]],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> bytes:
        code = grpc.StatusCode.OK
        admitted: Admitted | None = getattr(context, "ticket", None)
        ticket = admitted or Admitted(peer=context.peer())
        admission = self.admission
        slow = False
        try:
            if admitted is None:
                await self._admit(context, ticket, self.reserve_bytes)
            elif admitted.refusal is not None:
                raise admitted.refusal
            request, raw = await self._aread(request_type, context, ticket.subject)
            admission.resize(ticket.peer, ticket.held, len(raw), subject=ticket.subject)
            ticket.held = len(raw)
            answer = body(ticket.subject, request, raw)
            # The body holds the only reference to the request's bytes, and drops it
            # once it has read them (`submit` below), before the commit is awaited.
            del raw
            return (await answer).SerializeToString()
        except CollectorError as exc:
            code, detail, trailers = self._refused(method, exc, ticket.subject)
            slow = isinstance(exc, SubjectShareError)
        finally:
            if admitted is not None:
                admitted.refusal = None  # no exception (and its frames) kept alive
            self.settle(ticket)
            self._count(method, code)
        # Outside the except block: the exception and its frames are gone already.
        if slow:
            await self._tarpit(trailers, context)
        await context.abort(code, detail, trailing_metadata=trailers)
        raise AssertionError("unreachable: abort raises")

    def _tarpit_for(
        self, trailers: tuple[tuple[str, str], ...], remaining: float | None
    ) -> float | None:
        """Seconds to hold a share refusal's answer — its retry hint, at most
        `TARPIT_MAX_SECONDS` and half the time left to the call's deadline
        (`remaining` s; None: no deadline), so the device gets the hint, not
        DEADLINE_EXCEEDED — or None (answer at once) when `TARPIT_MAX_CALLS` are held already;
        a held one ends with `_tarpit_done`.

        Why hold it: a device that reopens its refused calls at once, its share
        held by calls withholding their bodies, would make its refusals a request
        flood (each costs a gRPC call's CPU); held for the hint (which grows with
        its streak: `RefusalHints`), each of its calls makes at most one refusal
        per `TARPIT_MAX_SECONDS` rather than as many as it can send.
        The call holds no RPC slot and no byte reservation meanwhile, and its
        stream at most the transport's look-ahead window; on the sync server it
        holds one of the `TARPIT_MAX_CALLS` threads the pool has beyond `workers`
        (an idle thread: no CPU), on the asyncio server a sleeping coroutine."""
        with self._tarpit_lock:
            if self._tarpitted >= TARPIT_MAX_CALLS:
                return None
            self._tarpitted += 1
        hint = next((int(v) for k, v in trailers if k == "retry-after-ms"), 0) / 1000
        if remaining is not None:
            hint = min(hint, remaining / 2)
        return max(0.0, min(hint, TARPIT_MAX_SECONDS))

    @property
    def held_refusals(self) -> int:
        """Share refusals being held for their hint now (`_tarpit_for`)."""
        with self._tarpit_lock:
            return self._tarpitted

    def _tarpit_done(self) -> None:
        """A held share refusal is answered (`_tarpit_for`)."""
        with self._tarpit_lock:
            self._tarpitted -= 1

    async def _tarpit(self, trailers: tuple[tuple[str, str], ...], context: Any) -> None:
        """`_tarpit_for` on the asyncio server: sleep for the hint, then answer."""
        wait = self._tarpit_for(trailers, context.time_remaining())
        if wait is None:
            return
        try:
            await asyncio.sleep(wait)
        finally:
            self._tarpit_done()

    def _async_methods(
        self,
    ) -> dict[str, tuple[type[Message], Callable[[str, Any, bytes], Awaitable[Message]]]]:
        """Each RPC's request type and body on the asyncio server: validation runs on
        the event loop, the ledger commit is awaited (group committer future),
        GetBudget's reads run in the default executor."""
        svc = self.service

        async def submit(subject: str, request: pb.SubmitRequest, raw: bytes) -> Message:
            prepared = svc.prepare(subject, request, raw)
            del raw  # not kept while the commit is awaited
            outcomes: list[Any] = []
            if prepared.batch.reports:
                outcomes = await svc.committer.submit_async(prepared.batch)
            return svc.finish(prepared, outcomes)

        async def get_policies(
            _subject: str, request: pb.GetPoliciesRequest, _raw: bytes
        ) -> Message:
            return svc.get_policies(request)

        async def get_budget(subject: str, request: pb.GetBudgetRequest, _raw: bytes) -> Message:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, svc.get_budget, subject, request)

        return {
            "Submit": (pb.SubmitRequest, submit),
            "GetPolicies": (pb.GetPoliciesRequest, get_policies),
            "GetBudget": (pb.GetBudgetRequest, get_budget),
        }

    async def handle_async(self, name: str, context: Any) -> bytes:
        """RPC `name` on the asyncio server's loop for any context with the
        grpc.aio ServicerContext calls `_acall` makes (the web endpoint's,
        collector/web.py): the same authentication, rate limit, admission, body
        deadline, service, metrics and refusals as over gRPC."""
        if self._methods is None:
            self._methods = self._async_methods()
        request_type, body = self._methods[name]
        return await self._acall(name, request_type, body, context)

    def async_handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The asyncio-server flavour of `handler` (`_async_methods`' bodies)."""

        def method(name: str) -> Any:
            async def behavior(_requests: Any, context: Any) -> bytes:
                return await self.handle_async(name, context)

            return grpc.stream_unary_rpc_method_handler(behavior)

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME, {name: method(name) for name in ("Submit", "GetPolicies", "GetBudget")}
        )

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The generic handler registering the three methods (the request stream of
        raw bytes, read by `_call` once admitted)."""
        svc = self.service

        def method(
            name: str, req: type[Message], body: Callable[[str, Any, bytes], Message]
        ) -> Any:
            def behavior(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
                return self._call(name, req, body, requests, context)

            return grpc.stream_unary_rpc_method_handler(behavior)

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Submit": method("Submit", pb.SubmitRequest, svc.submit),
                "GetPolicies": method(
                    "GetPolicies",
                    pb.GetPoliciesRequest,
                    lambda _subject, req, _raw: svc.get_policies(req),
                ),
                "GetBudget": method(
                    "GetBudget",
                    pb.GetBudgetRequest,
                    lambda subject, req, _raw: svc.get_budget(subject, req),
                ),
            },
        )


class _SyncTransport:
    """grpcio's sync server: a thread pool, one thread per in-flight RPC."""

    def __init__(
        self,
        config: CollectorConfig,
        servicer: CollectorServicer,
        options: list[tuple[str, Any]],
        creds: grpc.ServerCredentials | None,
    ) -> None:
        # No grpcio concurrency limit (its refusals carry no retry hint): the
        # handlers' admission bounds Collector RPCs; calls waiting for a thread are
        # bounded by connections x max_streams_per_connection and hold no more
        # than the transport's flow-control window each. The pool has
        # TARPIT_MAX_CALLS threads more than `workers`: at most that many sleep
        # holding a share refusal (CollectorServicer._tarpit_for), so `workers`
        # threads are always left for the other calls.
        self.server = grpc.server(
            ThreadPoolExecutor(
                max_workers=config.workers + TARPIT_MAX_CALLS, thread_name_prefix="rpc"
            ),
            options=options,
        )
        self.server.add_generic_rpc_handlers((servicer.handler(),))
        self.servicer = servicer
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = (
            self.server.add_secure_port(config.listen, creds)
            if creds is not None
            else self.server.add_insecure_port(config.listen)
        )
        if self.port == 0:
            raise OSError(f"could not bind {config.listen}")
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None) -> None:
        self.health.enter_graceful_shutdown()
        self.servicer.draining.set()
        self.server.stop(grace).wait()


class _AsyncTransport:
    """grpcio's asyncio server, on its own event loop thread."""

    def __init__(
        self,
        config: CollectorConfig,
        servicer: CollectorServicer,
        options: list[tuple[str, Any]],
        creds: grpc.ServerCredentials | None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self.thread.start()
        start = self._start(config, servicer, options, creds)
        self.port = asyncio.run_coroutine_threadsafe(start, self.loop).result()

    async def _start(
        self,
        config: CollectorConfig,
        servicer: CollectorServicer,
        options: list[tuple[str, Any]],
        creds: grpc.ServerCredentials | None,
    ) -> int:
        # No grpcio concurrency limit: its refusals carry no retry hint and count
        # health checks. The handlers' admission (collector/admission.py) bounds
        # Collector RPCs and their bytes before reading a request.
        self.server = grpc.aio.server(options=options)
        self.server.add_generic_rpc_handlers((servicer.async_handler(),))
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = (
            self.server.add_secure_port(config.listen, creds)
            if creds is not None
            else self.server.add_insecure_port(config.listen)
        )
        if port == 0:
            raise OSError(f"could not bind {config.listen}")
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return port

    async def _stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)

    def stop(self, grace: float | None) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(grace), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class _HealthPort:
    """A separate plaintext endpoint serving only the gRPC health service, on a
    sync server with threads of its own (`health_listen`): it answers while the
    main port sheds load, and says NOT_SERVING once the collector drains."""

    def __init__(self, listen: str) -> None:
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(listen)
        if self.port == 0:
            raise OSError(f"could not bind {listen}")
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def drain(self) -> None:
        """NOT_SERVING from now on."""
        self.health.enter_graceful_shutdown()

    def stop(self) -> None:
        self.server.stop(None).wait()


@dataclass
class RunningCollector:
    """A started collector: its port, ledger, metrics; `stop` drains it."""

    port: int
    transport: _SyncTransport | _AsyncTransport
    #: the ledger; shard 0 of a sharded ledger (then `shards` is the whole of it)
    ledger: Ledger
    metrics: CollectorMetrics
    committer: GroupCommitter | ShardedCommitter
    registry: PolicyRegistry
    service: CollectorService
    config: CollectorConfig | None = None
    clock: Callable[[], int] = field(default=lambda: int(time.time()))
    _metrics_server: Any = None
    health_port: _HealthPort | None = None
    admission: Admission | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)
    shards: ShardedLedger | None = None  # the sharded ledger (routing.py), if sharded
    web: Any = None  # the web endpoint (collector/web.py), when `web_listen` is set

    @property
    def web_port(self) -> int | None:
        """The web endpoint's port (Connect / gRPC-Web), None when it is off."""
        return self.web.port if self.web is not None else None

    @property
    def whole_ledger(self) -> AnyLedger:
        """The ledger every charge goes to: `shards` when sharded, else `ledger`."""
        return self.shards if self.shards is not None else self.ledger

    def reload_policies(self) -> PolicyRegistry:
        """Reload the trust and policy folders (SIGHUP); on any error keep the old set.

        All or nothing: a set that fails to load (`PolicyRegistry.from_folders`: a
        refused policy file, a malformed ``retired`` list, an unreadable folder) or
        to activate (`activate`: the ledger failed while checking lineage) is not
        served; the set served before stays, an ERROR line says so and why,
        `fedldp_collector_policy_reloads_total{result="failed"}` counts it, and the
        error is raised to the caller. Activation checks the new set's versions
        against their lineage in the ledger (a version that changes its policy
        id's window or metric is refused, logged and counted; the others are
        served). Requests in progress finish with the registry they started with;
        later ones see the new one (a single reference swap).
        """
        if self.config is None or not (self.config.trust_dir and self.config.policy_dir):
            raise ValueError("this collector was not started from policy folders")
        now = self.clock()
        try:
            registry = PolicyRegistry.from_folders(
                self.config.trust_dir,
                self.config.policy_dir,
                now=now,
                audience=self.config.audience,
            )
            activate(registry, self.whole_ledger, self.metrics, now=now, clock=self.clock)
        except (PolicyError, OSError, ValueError) as exc:
            self.metrics.policy_reloads.labels("failed").inc()
            log.error(
                "policy reload failed; keeping the policies served before",
                extra={
                    "fields": {
                        "error": str(exc),
                        "policies": len(self.registry.policies),
                        "inactive": len(self.registry.inactive),
                    }
                },
            )
            raise
        self.registry = registry
        self.service.registry = registry
        self.metrics.policy_reloads.labels("ok").inc()
        log.info(
            "policies reloaded",
            extra={
                "fields": {"policies": len(registry.policies), "inactive": len(registry.inactive)}
            },
        )
        return registry

    @property
    def address(self) -> str:
        """host:port to dial (loopback)."""
        return f"127.0.0.1:{self.port}"

    def stop(self, grace: float | None = 5.0) -> None:
        """Drain: health NOT_SERVING, refuse new RPCs, let in-flight ones commit (up to
        `grace` s), then flush the committer and close the ledger."""
        if self._stopped.is_set():
            return
        if self.health_port is not None:
            self.health_port.drain()
        if self.web is not None:
            self.web.stop()
        self.transport.stop(grace)
        if self.health_port is not None:
            self.health_port.stop()
        self.committer.close()
        self.whole_ledger.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self._stopped.set()
        log.info("collector stopped", extra={"fields": {"port": self.port}})

    def wait(self) -> None:
        """Block until `stop` has finished."""
        self._stopped.wait()


class PolicyActivationError(PolicyError):
    """The ledger could not be asked for the policies' lineage: nothing is activated."""


def activate(
    registry: PolicyRegistry,
    ledger: AnyLedger,
    metrics: CollectorMetrics,
    *,
    now: int,
    clock: Callable[[], int] | None = None,
) -> None:
    """Check `registry`'s versions against their lineage in `ledger` and record them
    in its policy versions (refusing those that would split a budget or lower the
    cap of a window already begun: `PolicyRegistry.enforce_lineage`, deciding at
    `clock()`, default `now`); log and count each refusal. The other versions are
    served.

    Raises PolicyActivationError when the ledger fails (the registry is then
    unchanged and must not be served: a reload keeps the set served before).
    """
    try:
        refusals = registry.enforce_lineage(ledger, now=now, clock=clock)
    except sa.exc.SQLAlchemyError as exc:
        raise PolicyActivationError(
            f"cannot check the policies' lineage in the ledger ({type(exc).__name__}); "
            "nothing activated: retry when the ledger database is reachable"
        ) from exc
    for refusal in refusals:
        metrics.policy_refusals.labels(refusal.reason).inc()
        log.error(
            "policy version refused activation",
            extra={
                "fields": {
                    "policy_id": refusal.policy_id,
                    "version": refusal.version,
                    "reason": refusal.reason,
                    "detail": refusal.detail,
                }
            },
        )


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _grpc_options(config: CollectorConfig) -> list[tuple[str, Any]]:
    """The gRPC server's channel options: message size, port reuse, streams per connection."""
    return [
        # Larger messages are refused by the transport (RESOURCE_EXHAUSTED).
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 1 if config.reuse_port else 0),
        ("grpc.max_concurrent_streams", config.max_streams_per_connection),
        # No bandwidth-delay probing: a stream's receive window stays at the
        # transport's look-ahead until its handler reads the message, so bytes of
        # requests not yet admitted stay (mostly) in the client.
        ("grpc.http2.bdp_probe", 0),
    ]


def _server_credentials(config: CollectorConfig) -> grpc.ServerCredentials | None:
    """TLS (mTLS when `config.mtls`) credentials from the configured files; None for
    plaintext. OSError when a file cannot be read."""
    if not config.tls_cert:
        return None
    return grpc.ssl_server_credentials(
        [(_read(config.tls_key), _read(config.tls_cert))],
        root_certificates=_read(config.tls_client_ca) if config.tls_client_ca else None,
        require_client_auth=config.mtls,
    )


def _load_registry(config: CollectorConfig, now: int) -> PolicyRegistry:
    """The policies of `config.policy_dir` verified against `config.trust_dir` at `now`;
    ConfigError when either folder is not configured."""
    if not (config.trust_dir and config.policy_dir):
        raise ConfigError("trust_dir and policy_dir are required")
    return PolicyRegistry.from_folders(
        config.trust_dir, config.policy_dir, now=now, audience=config.audience
    )


def _start_metrics_server(config: CollectorConfig, metrics: CollectorMetrics) -> Any:
    """The Prometheus HTTP endpoint on `config.metrics_listen` (host defaults to
    127.0.0.1), serving `metrics.registry`; None when no address is configured."""
    if not config.metrics_listen:
        return None
    from prometheus_client import start_http_server

    host, _, mport = config.metrics_listen.rpartition(":")
    metrics_server, _thread = start_http_server(
        int(mport), addr=host or "127.0.0.1", registry=metrics.registry
    )
    return metrics_server


def _log_serving(
    config: CollectorConfig,
    port: int,
    health_port: _HealthPort | None,
    policies: int,
    ledger: Ledger | ShardedLedger,
) -> None:
    """The one INFO line of a started collector: where it listens and what it serves."""
    log.info(
        "collector serving",
        extra={
            "fields": {
                "port": port,
                "health_port": health_port.port if health_port is not None else None,
                "server": config.server,
                "tls": bool(config.tls_cert),
                "mtls": config.mtls,
                "policies": policies,
                "ledger": ledger.dialect,
                "shard": ledger.shard,
            }
        },
    )


def _side_ports(
    config: CollectorConfig,
    servicer: CollectorServicer,
    transport: _SyncTransport | _AsyncTransport,
) -> tuple[_HealthPort | None, Any]:
    """The health port (`health_listen`) and the web endpoint (`web_listen`,
    collector/web.py, on the asyncio server's loop), each when configured; on an
    error neither is left running."""
    health_port = _HealthPort(config.health_listen) if config.health_listen else None
    try:
        web = None
        if config.web_listen and isinstance(transport, _AsyncTransport):
            from fedldp.collector.web import WebEndpoint

            web = WebEndpoint(config, servicer, transport.loop)
    except BaseException:
        if health_port is not None:
            health_port.stop()
        raise
    return health_port, web


def preflight(config: CollectorConfig, *, now: int) -> None:
    """Check everything `start_collector` reads before it binds, and bind nothing:
    the settings, the policy folders, the token secret, the TLS files, and the
    ledger — opened as a collector opens it (a new one created and migrated, a
    shard map checked or written) — with the policies' activation against it.

    A supervisor (`processes` > 1) calls it before it starts any process, so a
    bad input is one error from one process, the same as with one process,
    rather than every process failing on it in turn. Raises what
    `start_collector` would (ConfigError, PolicyError, LedgerOpenError, OSError,
    SQLAlchemy errors).
    """
    config.validate()
    registry = _load_registry(config, now)
    config.token_secret_bytes()
    _server_credentials(config)
    ledger = open_collector_ledger(config)
    try:
        activate(registry, ledger, CollectorMetrics(), now=now)
    finally:
        ledger.close()


def start_collector(
    config: CollectorConfig,
    *,
    registry: PolicyRegistry | None = None,
    clock: Callable[[], int] | None = None,
    before_bind: Callable[[], None] | None = None,
) -> RunningCollector:
    """Open the ledger, load policies, start serving; returns once the port is bound.

    `registry` overrides loading `config.trust_dir`/`config.policy_dir` (tests and
    the demo build one with `PolicyRegistry.from_envelopes`); either way its
    versions are checked against their lineage in the ledger (`activate`, in
    place) before anything is served. `clock` (Unix seconds) defaults to the
    system clock. `config.server` picks grpcio's sync or asyncio (default) server.
    `before_bind` runs just before the port is bound (a supervised process checks
    there that its supervisor is alive; what it raises is raised, nothing bound).
    """
    config.validate()
    now_fn: Callable[[], int] = clock or (lambda: int(time.time()))
    if registry is None:
        registry = _load_registry(config, now_fn())
    secret = config.token_secret_bytes()
    authenticator = Authenticator(TokenAuthority(secret) if secret else None, mtls=config.mtls)
    ledger = open_collector_ledger(config)
    metrics = CollectorMetrics()
    try:
        activate(registry, ledger, metrics, now=now_fn(), clock=now_fn)
    except BaseException:
        ledger.close()
        raise
    committer = make_committer(
        ledger,
        metrics,
        max_reports=config.group_commit_max_reports,
        delay_seconds=config.group_commit_delay_ms / 1000,
    )
    limits = Limits(
        config.max_reports_per_request, config.max_report_age_seconds, config.max_clock_skew_seconds
    )
    service = CollectorService(registry, ledger, committer, metrics, limits, now_fn)
    admission = Admission(
        max_rpcs=config.max_concurrent_rpcs,
        max_bytes=config.max_inflight_bytes,
        max_connection_bytes=config.max_connection_inflight_bytes,
        max_subject_bytes=config.subject_inflight_bytes(),
    )
    servicer = CollectorServicer(
        service,
        authenticator,
        RateLimiter(config.rate_limit_per_second, config.rate_limit_burst),
        metrics,
        now_fn,
        admission=admission,
        reserve_bytes=config.max_message_bytes,
        admission_wait=config.admission_wait_ms / 1000,
        body_timeout=config.body_timeout_ms / 1000,
    )
    kind = _AsyncTransport if config.server == "asyncio" else _SyncTransport
    try:
        creds = _server_credentials(config)
        if before_bind is not None:
            before_bind()
        transport = kind(config, servicer, _grpc_options(config), creds)
    except BaseException:
        committer.close()
        ledger.close()
        raise
    try:
        health_port, web = _side_ports(config, servicer, transport)
    except Exception:
        transport.stop(0)
        committer.close()
        ledger.close()
        raise
    metrics_server = _start_metrics_server(config, metrics)
    _log_serving(config, transport.port, health_port, len(registry.policies), ledger)
    return RunningCollector(
        transport.port,
        transport,
        ledger.shards[0] if isinstance(ledger, ShardedLedger) else ledger,
        metrics,
        committer,
        registry,
        service,
        config=config,
        clock=now_fn,
        _metrics_server=metrics_server,
        health_port=health_port,
        admission=admission,
        shards=ledger if isinstance(ledger, ShardedLedger) else None,
        web=web,
    )
