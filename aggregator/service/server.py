"""The release service's gRPC server: authentication, status codes, metrics, logs.

Each handler: authenticate (the analyst is the bearer token's subject or the
client certificate's common name: fedldp.collector.auth, the collector's own
scheme) -> parse the raw request bytes, refusing unknown fields (a cap or any
field this contract does not define cannot be smuggled in) -> ReleaseEngine ->
serialize. Status codes: see proto/fedldp/v1/release.proto.

Observability never carries data: Prometheus metrics are labelled by method,
status code and query kind only (no dataset values, no analyst names); each log
line is JSON with the method, code, query kind, dataset id, purpose,
reservation id and a keyed analyst tag (`analyst_tag`), never a released or
true value.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central import releases as rel
from fedldp.aggregator.central.datakey import DataKey
from fedldp.aggregator.service.addresses import check_plaintext, check_tls
from fedldp.aggregator.service.catalog import Catalog
from fedldp.aggregator.service.engine import (
    InvalidRequestError,
    NoCapError,
    PermissionDeniedError,
    ReleaseAfterReadError,
    ReleaseEngine,
    ServiceError,
)
from fedldp.aggregator.service.policy import ReleasePolicy, check_grants
from fedldp.aggregator.service.training import (
    JobConflictError,
    JobNotFoundError,
    JobNotReadyError,
    QueueFullError,
    TrainingDisabledError,
    TrainingJobs,
    TrainingSetup,
)
from fedldp.collector.auth import Authenticator
from fedldp.collector.errors import UnauthenticatedError
from fedldp.collector.ledger import (
    CentralBudgetExhaustedError,
    IdempotencyConflictError,
    Ledger,
    LedgerError,
    NoCentralCapError,
)
from fedldp.v1 import release_pb2 as pb
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger("fedldp.release_service")

SERVICE_NAME = "fedldp.v1.ReleaseService"

#: Domain error -> gRPC status code (most specific class first in the MRO walk).
STATUS: dict[type[BaseException], grpc.StatusCode] = {
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    NoCapError: grpc.StatusCode.FAILED_PRECONDITION,
    NoCentralCapError: grpc.StatusCode.FAILED_PRECONDITION,
    ReleaseAfterReadError: grpc.StatusCode.FAILED_PRECONDITION,
    CentralBudgetExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    IdempotencyConflictError: grpc.StatusCode.ALREADY_EXISTS,
    rel.ReleaseConflictError: grpc.StatusCode.ALREADY_EXISTS,
    rel.ReleaseInProgressError: grpc.StatusCode.UNAVAILABLE,
    rel.ReleaseFailedError: grpc.StatusCode.FAILED_PRECONDITION,
    rel.ReleaseCancelledError: grpc.StatusCode.FAILED_PRECONDITION,
}
#: Training jobs' refusals (training.py).
STATUS.update(
    {
        TrainingDisabledError: grpc.StatusCode.FAILED_PRECONDITION,
        QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
        JobConflictError: grpc.StatusCode.ALREADY_EXISTS,
        JobNotFoundError: grpc.StatusCode.NOT_FOUND,
        JobNotReadyError: grpc.StatusCode.FAILED_PRECONDITION,
    }
)
#: Errors whose own message is safe to send (no data in any of them).
_SAFE = (ServiceError, UnauthenticatedError, rel.ReleaseError, LedgerError)


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The status code of a refusal (UNAVAILABLE for other ledger errors)."""
    for cls in type(exc).__mro__:
        code = STATUS.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.UNAVAILABLE


class ReleaseMetrics:
    """Prometheus metrics: bounded labels only (method, code, kind)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fedldp_release_service_requests",
            "RPCs by method and gRPC status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.releases = Counter(
            "fedldp_release_service_releases",
            "Releases returned, by query kind",
            ["kind"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "fedldp_release_service_release_seconds",
            "Release latency (authorize, reserve, read, settle, sign), seconds",
            ["kind"],
            registry=self.registry,
        )
        self.training = TrainingMetrics(self.registry)


class TrainingMetrics:
    """Training jobs' metrics: job transitions by state, queue length, job seconds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Counter(
            "fedldp_release_service_training_jobs",
            "Training jobs entering a state (queued, succeeded, failed)",
            ["state"],
            registry=registry,
        )
        self.queue = Gauge(
            "fedldp_release_service_training_queue",
            "Training jobs waiting for a worker",
            registry=registry,
        )
        self.seconds = Histogram(
            "fedldp_release_service_training_seconds",
            "Training job run time (reserve, read, train, settle, sign), seconds",
            buckets=(1, 5, 15, 60, 300, 900, 3600, float("inf")),
            registry=registry,
        )


#: The tag key of a process that was given none: fresh random bytes (tags then
#: link one analyst's lines within this process only).
_PROCESS_TAG_KEY = secrets.token_bytes(32)


def tag_key_of(signing_key: Ed25519PrivateKey) -> bytes:
    """The service's analyst-tag key: SHA-256 of a label and the receipt signing key's
    private bytes. Stable across restarts of one service (log lines stay linkable),
    secret as long as the signing key is, and never usable to sign anything."""
    raw = signing_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return hashlib.sha256(b"fedldp release-service analyst tag v1\0" + raw).digest()


def analyst_tag(analyst: str, key: bytes | None = None) -> str:
    """A short tag of an analyst for logs: HMAC-SHA256 under a service secret, truncated
    to 48 bits. Without the key, a list of candidate names cannot be matched to tags."""
    mac = hmac.new(key or _PROCESS_TAG_KEY, analyst.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest()[:12]


class ReleaseServicer:
    """Raw-bytes handlers for the ReleaseService RPCs."""

    def __init__(
        self,
        engine: ReleaseEngine,
        authenticator: Authenticator,
        metrics: ReleaseMetrics,
        clock: Callable[[], int],
        training: TrainingJobs | None = None,
        tag_key: bytes | None = None,
    ) -> None:
        self.engine, self.authenticator = engine, authenticator
        self.metrics, self.clock, self.training = metrics, clock, training
        self.tag_key = tag_key

    def _begin(self, kind: type[Message], raw: bytes, context: Any) -> tuple[str, Any]:
        auth_context = context.auth_context() if self.authenticator.mtls else {}
        analyst = self.authenticator.subject_from(
            context.invocation_metadata() or (), auth_context, now=self.clock()
        )
        try:
            request = kind.FromString(raw)
        except DecodeError:
            raise InvalidRequestError(
                f"the request is not a valid {kind.DESCRIPTOR.full_name}"
            ) from None
        if _has_unknown_fields(request):
            raise InvalidRequestError(
                "the request carries fields this contract does not define (a cap, a ledger "
                "or a subject can never be sent); nothing was charged"
            )
        return analyst, request

    def _call(
        self,
        method: str,
        kind: type[Message],
        body: Callable[[str, Any], Message],
        raw: bytes,
        context: grpc.ServicerContext,
    ) -> bytes:
        analyst = ""
        fields: dict[str, Any] = {"method": method}
        started = time.perf_counter()
        try:
            analyst, request = self._begin(kind, raw, context)
            fields["analyst_tag"] = analyst_tag(analyst, self.tag_key)
            if isinstance(request, pb.ReleaseRequest):
                fields.update(
                    dataset=request.dataset,
                    purpose=request.purpose,
                    kind=request.WhichOneof("query"),
                )
            elif isinstance(request, pb.SubmitTrainingRequest):
                fields.update(dataset=request.dataset, purpose=request.purpose, kind="training")
            response = body(analyst, request)
        except (*_SAFE, ValueError) as exc:
            code = status_of(exc) if isinstance(exc, _SAFE) else grpc.StatusCode.INVALID_ARGUMENT
            message = str(exc) if isinstance(exc, _SAFE) else "invalid request"
            self._log(fields, code, error=type(exc).__name__)
            context.abort(code, message)
        except Exception as exc:  # a bug or an unreachable database: no detail leaves
            log.debug("internal", exc_info=True)
            self._log(fields, grpc.StatusCode.INTERNAL, error=type(exc).__name__)
            context.abort(grpc.StatusCode.INTERNAL, "internal error; nothing was released")
        if isinstance(response, pb.TrainingJob):
            fields.update(job_id=response.job_id, reservation_id=response.reservation_id)
        if isinstance(response, pb.ReleaseResponse):
            fields["reservation_id"] = response.reservation_id
            self.metrics.releases.labels(response.kind).inc()
            self.metrics.seconds.labels(response.kind).observe(time.perf_counter() - started)
        self._log(fields, grpc.StatusCode.OK)
        return response.SerializeToString()

    def _log(self, fields: dict[str, Any], code: grpc.StatusCode, **extra: str) -> None:
        self.metrics.requests.labels(fields["method"], code.name).inc()
        level = logging.INFO if code is grpc.StatusCode.OK else logging.WARNING
        log.log(
            level, "release service call", extra={"fields": {**fields, "code": code.name, **extra}}
        )

    def release(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """The Release RPC (raw bytes in and out): authenticated, logged, counted."""
        return self._call("Release", pb.ReleaseRequest, self.engine.release, raw, context)

    def list_datasets(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """The ListDatasets RPC: the datasets and queries the caller may use."""
        return self._call(
            "ListDatasets",
            pb.ListDatasetsRequest,
            lambda analyst, _req: self.engine.datasets_for(analyst),
            raw,
            context,
        )

    def _jobs(self) -> TrainingJobs:
        if self.training is None:
            raise TrainingDisabledError("training jobs are not enabled on this service")
        return self.training

    def submit_training(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """The SubmitTraining RPC: validates, stores and queues a job, returning its
        TrainingJob; aborts FAILED_PRECONDITION when training is disabled."""
        return self._call(
            "SubmitTraining",
            pb.SubmitTrainingRequest,
            lambda analyst, req: self._jobs().submit(analyst, req),
            raw,
            context,
        )

    def get_training_job(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """The GetTrainingJob RPC: one of the caller's jobs (after waiting up to its
        `wait_seconds`); another analyst's job is reported as not found."""
        return self._call(
            "GetTrainingJob",
            pb.GetTrainingJobRequest,
            lambda analyst, req: self._jobs().job(analyst, req),
            raw,
            context,
        )

    def fetch_model(self, raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        """The model's pieces; every check (owner, state, digest) happens before the first."""
        chunks: list[Iterator[pb.ModelChunk]] = []

        def body(analyst: str, request: Any) -> Message:
            chunks.append(self._jobs().model_chunks(analyst, request))
            return pb.ModelChunk()

        self._call("FetchModel", pb.FetchModelRequest, body, raw, context)
        for chunk in chunks[0]:
            yield chunk.SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The generic handler (raw bytes in and out) of the service."""
        methods = {
            "Release": grpc.unary_unary_rpc_method_handler(self.release),
            "ListDatasets": grpc.unary_unary_rpc_method_handler(self.list_datasets),
            "SubmitTraining": grpc.unary_unary_rpc_method_handler(self.submit_training),
            "GetTrainingJob": grpc.unary_unary_rpc_method_handler(self.get_training_job),
            "FetchModel": grpc.unary_stream_rpc_method_handler(self.fetch_model),
        }
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


def _has_unknown_fields(message: Message) -> bool:
    """True when `message` or any message field in it carries unknown fields."""
    if len(UnknownFieldSet(message)):
        return True
    for descriptor, value in message.ListFields():
        singular = not descriptor.is_repeated
        if descriptor.message_type is not None and singular and _has_unknown_fields(value):
            return True
    return False


@dataclass
class ServiceConfig:
    """Everything the service needs; paths are operator-owned files."""

    catalog: Catalog
    policy: ReleasePolicy
    ledger_url: str
    signing_key: Ed25519PrivateKey
    authenticator: Authenticator
    data_key: DataKey | None = None
    #: None: the signed policy's service id; any other value must equal it.
    service_id: str | None = None
    listen: str = "127.0.0.1:0"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    #: Serve plaintext on a non-loopback `listen` (bearer tokens then cross the network
    #: in clear text: only behind a TLS-terminating proxy on the same host or network).
    insecure: bool = False
    max_workers: int = 8
    #: Training jobs (None: SubmitTraining answers FAILED_PRECONDITION).
    training: TrainingSetup | None = None


@dataclass
class RunningReleaseService:
    """A started service: its port, ledger, metrics and engine; `stop` drains it."""

    port: int
    server: grpc.Server
    ledger: Ledger
    metrics: ReleaseMetrics
    engine: ReleaseEngine
    health: Any
    training: TrainingJobs | None = None

    def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING, finish in-flight calls and (within `grace`) running training
        jobs, close the ledger."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        if self.training is not None:
            self.training.stop(grace)
        self.ledger.close()


def start_release_service(
    config: ServiceConfig, *, clock: Callable[[], int] | None = None
) -> RunningReleaseService:
    """Check the configuration, register the catalog's datasets, apply the policy's caps,
    and serve.

    Refuses to start (ValueError, one line, nothing served) on a TLS option
    without its partner (`check_tls`), an [[analyst_cap]] naming an analyst the
    catalog does not grant that purpose, a dataset whose data do not match its
    declaration (Catalog.check_registered), or a policy the ledger refuses
    (ReleasePolicy.apply: another service id, a raised or a dropped cap).
    """
    from fedldp.collector.ledger.shards import open_central_ledger

    now_fn = clock or (lambda: int(time.time()))
    check_tls(config.tls_cert, config.tls_key, config.tls_client_ca, mtls=config.authenticator.mtls)
    check_plaintext(config.listen, tls=config.tls_cert is not None, insecure=config.insecure)
    check_grants(config.policy, config.catalog.grants)
    config.catalog.check_registered()
    ledger = open_central_ledger(config.ledger_url)
    training: TrainingJobs | None = None
    try:
        config.policy.apply(ledger, config.service_id)
        engine = ReleaseEngine(
            config.catalog,
            config.policy,
            ledger,
            config.signing_key,
            config.policy.service_id,
            now_fn,
            data_key=config.data_key,
        )
        metrics = ReleaseMetrics()
        if config.training is not None:
            training = TrainingJobs(
                config.training,
                engine,
                config.catalog,
                config.policy,
                ledger,
                config.policy.service_id,
                now_fn,
                metrics.training,
            )
            training.start()
        servicer = ReleaseServicer(
            engine,
            config.authenticator,
            metrics,
            now_fn,
            training,
            tag_key_of(config.signing_key),
        )
        server = grpc.server(ThreadPoolExecutor(max_workers=config.max_workers))
        server.add_generic_rpc_handlers((servicer.handler(),))
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = _bind(server, config)
        server.start()
    except BaseException:
        if training is not None:
            training.stop(0)
        ledger.close()
        raise
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "release service serving",
        extra={
            "fields": {
                "port": port,
                "service_id": config.policy.service_id,
                "policy_version": config.policy.version,
                "policy_sha256": config.policy.sha256,
                "policy_signer": config.policy.signer,
                "datasets": sorted(d.id for d in config.catalog.datasets.values() if d.registered),
                "ledger": ledger.dialect,
            }
        },
    )
    return RunningReleaseService(port, server, ledger, metrics, engine, health_servicer, training)


def _bind(server: grpc.Server, config: ServiceConfig) -> int:
    if config.tls_cert is None or config.tls_key is None:
        return server.add_insecure_port(config.listen)
    creds = grpc.ssl_server_credentials(
        [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
        root_certificates=config.tls_client_ca.read_bytes() if config.tls_client_ca else None,
        require_client_auth=config.authenticator.mtls,
    )
    return server.add_secure_port(config.listen, creds)
