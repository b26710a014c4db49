"""The gRPC server: thin handlers around `CollectorService`, and its lifecycle.

Each handler: authenticate (subject from the token or client certificate, never
from the request) -> rate limit -> parse the raw request bytes -> service call
-> serialize. Nothing is read or written before authentication succeeds.
Handlers receive raw bytes (no gRPC-side deserializer) so that a truncated or
garbage message gets INVALID_ARGUMENT from `errors.STATUS`, not INTERNAL.

Server choice: grpcio's sync server (a thread pool) by default, the asyncio
server on request (`server = "asyncio"`; one event-loop thread runs every
handler and the group committer resolves a whole group's futures with one
callback): see docs/collector.md for the measurements on this machine. Durable
throughput comes from the group committer either way.

`start_collector(config)` runs a collector in-process (tests, the demo, the
daemon); `RunningCollector.stop(grace)` drains: health goes NOT_SERVING, new
RPCs are refused, in-flight ones finish (committing), then the committer and
the ledger close.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import sqlalchemy as sa
from fedldp.client.policy import PolicyError
from fedldp.collector.auth import Authenticator, TokenAuthority
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.config import CollectorConfig, ConfigError
from fedldp.collector.errors import (
    CollectorError,
    MalformedRequestError,
    RateLimitedError,
    UnauthenticatedError,
    status_of,
)
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.ratelimit import RateLimiter
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


class CollectorServicer:
    """Raw-bytes handlers for the three Collector RPCs."""

    def __init__(
        self,
        service: CollectorService,
        authenticator: Authenticator,
        limiter: RateLimiter,
        metrics: CollectorMetrics,
        clock: Callable[[], int],
    ) -> None:
        self.service = service
        self.authenticator = authenticator
        self.limiter = limiter
        self.metrics = metrics
        self.clock = clock
        self._request_children: dict[tuple[str, grpc.StatusCode], Any] = {}

    def _count(self, method: str, code: grpc.StatusCode) -> None:
        """Count one RPC by method and status (the labelled child is bound once)."""
        child = self._request_children.get((method, code))
        if child is None:
            child = self.metrics.requests.labels(method, code.name)
            self._request_children[(method, code)] = child
        child.inc()

    def _begin(
        self, request_type: type[Message], request_bytes: bytes, context: Any
    ) -> tuple[str, Any]:
        """Authenticate, rate-limit and parse; the subject and the request message."""
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
            )
        try:
            request = request_type.FromString(request_bytes)
        except DecodeError:
            raise MalformedRequestError(
                f"the request is not a valid {request_type.DESCRIPTOR.full_name}"
            ) from None
        return subject, request

    def _refused(self, method: str, exc: CollectorError, subject: str) -> grpc.StatusCode:
        code = status_of(exc)
        level = logging.INFO if isinstance(exc, UnauthenticatedError) else logging.WARNING
        log.log(
            level,
            "request refused",
            extra={
                "fields": {
                    "method": method,
                    "code": code.name,
                    "error": type(exc).__name__,
                    "subject_tag": _subject_tag(subject) if subject else None,
                }
            },
        )
        return code

    def _call(
        self,
        method: str,
        request_type: type[Message],
        body: Callable[[str, Any], Message],
        request_bytes: bytes,
        context: grpc.ServicerContext,
    ) -> bytes:
        code = grpc.StatusCode.OK
        subject = ""
        try:
            subject, request = self._begin(request_type, request_bytes, context)
            return body(subject, request).SerializeToString()
        except CollectorError as exc:
            code = self._refused(method, exc, subject)
            if exc.metadata:
                context.set_trailing_metadata(exc.metadata)
            context.abort(code, str(exc))
            raise  # unreachable: abort raises
        finally:
            self._count(method, code)

    async def _acall(
        self,
        method: str,
        request_type: type[Message],
        body: Callable[[str, Any], Awaitable[Message]],
        request_bytes: bytes,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> bytes:
        code = grpc.StatusCode.OK
        subject = ""
        try:
            subject, request = self._begin(request_type, request_bytes, context)
            return (await body(subject, request)).SerializeToString()
        except CollectorError as exc:
            code = self._refused(method, exc, subject)
            await context.abort(code, str(exc), trailing_metadata=exc.metadata)
            raise  # unreachable: abort raises
        finally:
            self._count(method, code)

    def async_handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The asyncio-server flavour of `handler`: validation runs on the event loop,
        the ledger commit is awaited (group committer future), GetBudget's reads run
        in the default executor."""
        svc = self.service

        async def submit(subject: str, request: pb.SubmitRequest) -> Message:
            prepared = svc.prepare(subject, request)
            outcomes: list[Any] = []
            if prepared.batch.reports:
                outcomes = await svc.committer.submit_async(prepared.batch)
            return svc.finish(prepared, outcomes)

        async def get_policies(_subject: str, request: pb.GetPoliciesRequest) -> Message:
            return svc.get_policies(request)

        async def get_budget(subject: str, request: pb.GetBudgetRequest) -> Message:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, svc.get_budget, subject, request)

        def method(
            name: str, req: type[Message], body: Callable[[str, Any], Awaitable[Message]]
        ) -> Any:
            async def behavior(request_bytes: bytes, context: Any) -> bytes:
                return await self._acall(name, req, body, request_bytes, context)

            return grpc.unary_unary_rpc_method_handler(behavior)

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Submit": method("Submit", pb.SubmitRequest, submit),
                "GetPolicies": method("GetPolicies", pb.GetPoliciesRequest, get_policies),
                "GetBudget": method("GetBudget", pb.GetBudgetRequest, get_budget),
            },
        )

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The generic handler registering the three methods (raw request bytes)."""
        svc = self.service

        def method(name: str, req: type[Message], body: Callable[[str, Any], Message]) -> Any:
            def behavior(request_bytes: bytes, context: grpc.ServicerContext) -> bytes:
                return self._call(name, req, body, request_bytes, context)

            return grpc.unary_unary_rpc_method_handler(behavior)

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Submit": method("Submit", pb.SubmitRequest, svc.submit),
                "GetPolicies": method(
                    "GetPolicies",
                    pb.GetPoliciesRequest,
                    lambda _subject, req: svc.get_policies(req),
                ),
                "GetBudget": method("GetBudget", pb.GetBudgetRequest, svc.get_budget),
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
        self.server = grpc.server(
            ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="rpc"),
            options=options,
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        )
        self.server.add_generic_rpc_handlers((servicer.handler(),))
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
        self.server = grpc.aio.server(
            options=options, maximum_concurrent_rpcs=config.max_concurrent_rpcs
        )
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


@dataclass
class RunningCollector:
    """A started collector: its port, ledger, metrics; `stop` drains it."""

    port: int
    transport: _SyncTransport | _AsyncTransport
    ledger: Ledger
    metrics: CollectorMetrics
    committer: GroupCommitter
    registry: PolicyRegistry
    service: CollectorService
    config: CollectorConfig | None = None
    clock: Callable[[], int] = field(default=lambda: int(time.time()))
    _metrics_server: Any = None
    _stopped: threading.Event = field(default_factory=threading.Event)

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
            activate(registry, self.ledger, self.metrics, now=now)
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
        self.transport.stop(grace)
        self.committer.close()
        self.ledger.close()
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
    registry: PolicyRegistry, ledger: Ledger, metrics: CollectorMetrics, *, now: int
) -> None:
    """Check `registry`'s versions against their lineage in `ledger` (refusing those
    that would split a budget: `PolicyRegistry.enforce_lineage`); log and count each
    refusal. The other versions are served.

    Raises PolicyActivationError when the ledger fails (the registry is then
    unchanged and must not be served: a reload keeps the set served before).
    """
    try:
        refusals = registry.enforce_lineage(ledger, now=now)
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


def start_collector(
    config: CollectorConfig,
    *,
    registry: PolicyRegistry | None = None,
    clock: Callable[[], int] | None = None,
) -> RunningCollector:
    """Open the ledger, load policies, start serving; returns once the port is bound.

    `registry` overrides loading `config.trust_dir`/`config.policy_dir` (tests and
    the demo build one with `PolicyRegistry.from_envelopes`); either way its
    versions are checked against their lineage in the ledger (`activate`, in
    place) before anything is served. `clock` (Unix
    seconds) defaults to the system clock. `config.server` picks grpcio's sync
    (default) or asyncio server.
    """
    config.validate()
    now_fn: Callable[[], int] = clock or (lambda: int(time.time()))
    if registry is None:
        if not (config.trust_dir and config.policy_dir):
            raise ConfigError("trust_dir and policy_dir are required")
        registry = PolicyRegistry.from_folders(
            config.trust_dir, config.policy_dir, now=now_fn(), audience=config.audience
        )
    secret = config.token_secret_bytes()
    authenticator = Authenticator(TokenAuthority(secret) if secret else None, mtls=config.mtls)
    ledger = open_ledger(
        config.ledger_url,
        shard=config.instance_id or None,
        isolation=config.ledger_isolation or None,
    )
    metrics = CollectorMetrics()
    try:
        activate(registry, ledger, metrics, now=now_fn())
    except BaseException:
        ledger.close()
        raise
    committer = GroupCommitter(
        ledger,
        metrics,
        max_reports=config.group_commit_max_reports,
        delay_seconds=config.group_commit_delay_ms / 1000,
    )
    limits = Limits(
        config.max_reports_per_request, config.max_report_age_seconds, config.max_clock_skew_seconds
    )
    service = CollectorService(registry, ledger, committer, metrics, limits, now_fn)
    limiter = RateLimiter(config.rate_limit_per_second, config.rate_limit_burst)
    servicer = CollectorServicer(service, authenticator, limiter, metrics, now_fn)
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 1 if config.reuse_port else 0),
    ]
    creds = None
    if config.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(_read(config.tls_key), _read(config.tls_cert))],
            root_certificates=_read(config.tls_client_ca) if config.tls_client_ca else None,
            require_client_auth=config.mtls,
        )
    kind = _AsyncTransport if config.server == "asyncio" else _SyncTransport
    try:
        transport = kind(config, servicer, options, creds)
    except Exception:
        committer.close()
        ledger.close()
        raise
    metrics_server = None
    if config.metrics_listen:
        from prometheus_client import start_http_server

        host, _, mport = config.metrics_listen.rpartition(":")
        metrics_server, _thread = start_http_server(
            int(mport), addr=host or "127.0.0.1", registry=metrics.registry
        )
    log.info(
        "collector serving",
        extra={
            "fields": {
                "port": transport.port,
                "server": config.server,
                "tls": bool(config.tls_cert),
                "mtls": config.mtls,
                "policies": len(registry.policies),
                "ledger": ledger.dialect,
                "shard": ledger.shard,
            }
        },
    )
    return RunningCollector(
        transport.port,
        transport,
        ledger,
        metrics,
        committer,
        registry,
        service,
        config=config,
        clock=now_fn,
        _metrics_server=metrics_server,
    )
