"""Real infrastructure for the SDK integration tests: a collector, a TCP relay, a gRPC proxy.

Nothing here mocks gRPC or the collector. The collector is the real one
(`fedldp.collector.server.start_collector`) on a SQLite ledger file; faults are
injected *between* the SDK and it, by

* `Relay`: a TCP relay that copies bytes both ways, records what the device sent,
  can cut the first connections, and can run a hook when the collector answers;
* `FaultProxy`: a real gRPC server that forwards each call's raw request bytes to
  the collector and can refuse the first calls with UNAVAILABLE (+ retry hint),
  or forward a call and then lose its answer; it logs every Submit call's
  arrival, answer and retry hint (a counting relay).

`SubmitWatch` counts a client's own Submit attempts (whether or not anything
listens) and lets a test wait for deliveries without polling.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from fedldp.authoring import Authority
from fedldp.client.sdk import Client, TrustRoot
from fedldp.client.transport import Backoff, Credentials, TransportError, retry_after_seconds
from fedldp.collector.auth import TokenAuthority
from fedldp.collector.config import CollectorConfig
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import policy_pb2

#: The device process used by the crash and light-install tests.
CHILD = Path(__file__).with_name("sdk_crash_child.py")

LABELS = ("news.example", "mail.example", "shop.example", "video.example")
AUDIENCE = "default"


@dataclass
class Deployment:
    """An authority, its signed policies, a token secret, and collectors started from them."""

    tmp: Path
    now: int
    authority: Authority = field(init=False)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    envelopes: list[policy_pb2.SignedEnvelope] = field(default_factory=list)
    collectors: list[RunningCollector] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.authority = Authority.generate(now=self.now - 60)

    def categorical(
        self,
        policy_id: str = "homepage",
        *,
        epsilon: str = "1",
        epsilon_cap: str = "3",
        metric: str = "browser.homepage",
        window_seconds: int = 86400,
        version: int = 1,
        labels: Sequence[str] = LABELS,
    ) -> policy_pb2.SignedEnvelope:
        policy = self.authority.categorical_policy(
            policy_id=policy_id,
            metric=metric,
            labels=list(labels),
            epsilon=epsilon,
            epsilon_cap=epsilon_cap,
            window_seconds=window_seconds,
            now=self.now - 60,
            version=version,
            min_reports=1,
            audience=(AUDIENCE,),
        )
        envelope = self.authority.sign(policy)
        self.envelopes.append(envelope)
        return envelope

    def start(
        self,
        envelopes: Sequence[policy_pb2.SignedEnvelope] | None = None,
        *,
        name: str = "ledger",
        **config: Any,
    ) -> RunningCollector:
        trust = self.authority.trust_store(now=self.now)
        registry = PolicyRegistry.from_envelopes(
            self.envelopes if envelopes is None else envelopes,
            trust,
            now=int(time.time()),
            audience=AUDIENCE,
        )
        settings: dict[str, Any] = {
            "ledger_url": f"sqlite:///{self.tmp / (name + '.db')}",
            "token_secret": self.secret.hex(),
            "audience": AUDIENCE,
            "workers": 8,
            "log_level": "WARNING",
        }
        settings.update(config)
        running = start_collector(CollectorConfig(**settings), registry=registry)
        self.collectors.append(running)
        return running

    def outage(self, collector: RunningCollector) -> PortHold:
        """Stop `collector` and keep its port (see `PortHold`) until `restart`."""
        collector.stop(grace=0)
        return PortHold(collector.port)

    def restart(self, hold: PortHold, **config: Any) -> RunningCollector:
        """Start the collector again on the held port, with the same ledger file."""
        hold.release()
        return self.start(listen=f"127.0.0.1:{hold.port}", **config)

    def token(self, subject: str = "device-1") -> str:
        return TokenAuthority(self.secret).mint(subject, expires_at=int(time.time()) + 86400)

    def trust_root(self) -> TrustRoot:
        return TrustRoot(self.authority.root_envelope, self.authority.root_public_keys)

    def client(
        self,
        target: str,
        state_dir: Path,
        *,
        subject: str = "device-1",
        token: str | None = None,
        **kwargs: Any,
    ) -> Client:
        kwargs.setdefault("timeout_seconds", 5.0)
        return Client(
            target,
            trust_root=self.trust_root(),
            state_dir=state_dir,
            credentials=Credentials.insecure_bearer(token or self.token(subject)),
            **kwargs,
        )

    def trust_dir(self) -> Path:
        """A trust folder (pinned/root.pem + 1.root) as an app would ship it."""
        from fedldp.authoring import write_envelope, write_public_key

        folder = self.tmp / "trust"
        if not folder.exists():
            (folder / "pinned").mkdir(parents=True)
            write_public_key(self.authority.root_public_keys[0], folder / "pinned" / "root.pem")
            write_envelope(self.authority.root_envelope, folder / "1.root")
        return folder

    def stop(self) -> None:
        for c in self.collectors:
            c.stop(grace=1.0)


class PortHold:
    """A stopped collector's port, kept from other processes during the outage.

    A socket bound to the port but not listening: the device's connection
    attempts are refused, as with nothing there, and no other process on the
    machine can be given the port meanwhile (so the restart on the same port
    cannot find it taken).
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))

    def release(self) -> None:
        self._socket.close()


# --- TCP relay ---------------------------------------------------------------------------


class Relay:
    """Copies TCP bytes between the device and `upstream`, recording the device's bytes.

    `cut_first`: the first N connections are closed as soon as the device's bytes on
    them contain `cut_on` (default b"": as soon as the device sends anything); the
    chunk that completes it is not passed on, so the message carrying `cut_on`
    never reaches the collector. `on_upstream_data(conn_index)` runs
    before each chunk from the collector is passed on; if it returns False the
    connection is cut instead (the answer is lost).
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        cut_first: int = 0,
        cut_on: bytes = b"",
        on_upstream_data: Callable[[int], bool] | None = None,
    ) -> None:
        self.upstream = upstream
        self.cut_first = cut_first
        self.cut_on = cut_on
        self.on_upstream_data = on_upstream_data
        self.sent: list[bytearray] = []  # device -> collector bytes, per connection
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                device, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                index = self.connections
                self.connections += 1
                self.sent.append(bytearray())
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                device.close()
                continue
            self._sockets += [device, server]
            cut = index < self.cut_first
            threading.Thread(
                target=self._pump_up, args=(device, server, index, cut), daemon=True
            ).start()
            threading.Thread(
                target=self._pump_down, args=(server, device, index), daemon=True
            ).start()

    def _pump_up(self, src: socket.socket, dst: socket.socket, index: int, cut: bool) -> None:
        seen = bytearray()  # everything the device sent on this connection
        try:
            while data := src.recv(65536):
                seen += data
                if cut and self.cut_on in seen:
                    break
                with self._lock:
                    self.sent[index] += data
                dst.sendall(data)
        except OSError:
            pass
        _close(src, dst)

    def _pump_down(self, src: socket.socket, dst: socket.socket, index: int) -> None:
        try:
            while data := src.recv(65536):
                if self.on_upstream_data is not None and not self.on_upstream_data(index):
                    break
                dst.sendall(data)
        except OSError:
            pass
        _close(src, dst)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            _close(s)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


# --- gRPC fault proxy --------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyCall:
    """One Submit call through `FaultProxy` (monotonic times, this process)."""

    arrived: float
    answered: float
    code: str  # "OK" or the status code's name
    retry_after_ms: int | None


class FaultProxy:
    """A real gRPC server forwarding raw request bytes to the collector, with faults.

    `fail_first`: the first N Submit calls are answered UNAVAILABLE with a
    ``retry-after-ms`` hint (nothing reaches the collector). `lose_first`: the
    first N Submit calls (after those) are forwarded and committed, then answered
    UNAVAILABLE (the acknowledgement is lost). `stall_first`: the first N
    Submit calls (after those) wait, unanswered and not forwarded, until the
    proxy closes; `stalled` is set when the first arrives (a call in flight).
    Every Submit request's bytes are recorded in `submits`.
    """

    def __init__(
        self,
        upstream: str,
        *,
        fail_first: int = 0,
        lose_first: int = 0,
        stall_first: int = 0,
        retry_after_ms: int | None = 50,
    ) -> None:
        self.fail_first = fail_first
        self.lose_first = lose_first
        self.stall_first = stall_first
        self.stalled = threading.Event()
        self._closing = threading.Event()
        self.retry_after_ms = retry_after_ms
        self.submits: list[bytes] = []
        self.outcomes: list[str] = []
        self.calls: list[ProxyCall] = []
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(upstream)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((_ProxyHandler(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        arrived = time.monotonic()
        code, hint = "OK", None
        try:
            return self._forward(method, request, context)
        except _AbortError as abort:
            code, hint = abort.code.name, abort.retry_after_ms
            if hint is not None:
                context.set_trailing_metadata((("retry-after-ms", str(hint)),))
            context.abort(abort.code, abort.detail)
        finally:
            if method.endswith("/Submit"):
                with self._lock:
                    self.calls.append(ProxyCall(arrived, time.monotonic(), code, hint))

    def _forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = tuple((k, v) for k, v in context.invocation_metadata() if k == "authorization")
        fault = None
        if method.endswith("/Submit"):
            with self._lock:
                n = len(self.submits)
                self.submits.append(request)
                if n < self.fail_first:
                    fault = "fail"
                elif n < self.fail_first + self.lose_first:
                    fault = "lose"
                elif n < self.fail_first + self.lose_first + self.stall_first:
                    fault = "stall"
                self.outcomes.append(fault or "ok")
        if fault == "stall":
            self.stalled.set()
            self._closing.wait()
            raise _AbortError(grpc.StatusCode.UNAVAILABLE, "injected: stalled call", None)
        if fault == "fail":
            raise _AbortError(
                grpc.StatusCode.UNAVAILABLE, "injected: collector unavailable", self.retry_after_ms
            )
        call = self._channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )
        try:
            response: bytes = call(request, metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            # Pass the collector's answer on, retry hint included. The exception is
            # the call itself (grpc-stubs types RpcError without Call's metadata).
            answer: grpc.Call = exc  # type: ignore[assignment]
            hint = retry_after_seconds(answer.trailing_metadata())
            raise _AbortError(
                answer.code(),
                answer.details() or "",
                None if hint is None else round(hint * 1000),
            ) from None
        if fault == "lose":
            raise _AbortError(
                grpc.StatusCode.UNAVAILABLE, "injected: answer lost after commit", None
            )
        return response

    def close(self) -> None:
        self._closing.set()
        self._server.stop(None)
        self._channel.close()


class _AbortError(Exception):
    def __init__(self, code: grpc.StatusCode, detail: str, retry_after_ms: int | None) -> None:
        super().__init__(detail)
        self.code, self.detail, self.retry_after_ms = code, detail, retry_after_ms


if TYPE_CHECKING:  # generic in grpc-stubs only; not subscriptable at run time
    _GenericRpcHandler = grpc.GenericRpcHandler[bytes, bytes]
else:
    _GenericRpcHandler = grpc.GenericRpcHandler


class _ProxyHandler(_GenericRpcHandler):
    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        method = handler_call_details.method

        def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self.proxy.forward(method, request, context)

        return grpc.unary_unary_rpc_method_handler(behavior)


# --- watching a client's Submit calls -------------------------------------------------------


class SubmitWatch:
    """Counts a client's Submit attempts and acknowledged reports; waits on them.

    Wraps the client's own `Transport.submit_raw` (instance attribute), so it
    sees every attempt, including those that never reach a server. `wait_for`
    blocks on a condition variable notified after each call: no polling.
    """

    def __init__(self, client: Client) -> None:
        self.calls: list[tuple[float, bool, int]] = []  # (monotonic start, ok, reports)
        self._condition = threading.Condition()
        transport = client._transport
        original = transport.submit_raw

        def submit_raw(reports: Sequence[bytes]) -> Any:
            started = time.monotonic()
            try:
                response = original(reports)
            except TransportError:
                self._add((started, False, len(reports)))
                raise
            self._add((started, True, len(reports)))
            return response

        transport.submit_raw = submit_raw  # type: ignore[method-assign]

    def _add(self, call: tuple[float, bool, int]) -> None:
        with self._condition:
            self.calls.append(call)
            self._condition.notify_all()

    def delivered(self) -> int:
        """Reports in successful calls (all acknowledged by a healthy collector)."""
        with self._condition:
            return sum(n for _, ok, n in self.calls if ok)

    def failures(self, since: float = 0.0) -> int:
        """Failed calls started at or after `since` (monotonic)."""
        with self._condition:
            return sum(not ok for t, ok, _ in self.calls if t >= since)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate()` (re-checked after each call) holds, up to `timeout` s."""
        with self._condition:
            return self._condition.wait_for(predicate, timeout)


@dataclass(frozen=True)
class NoJitter(Backoff):
    """A backoff whose delay is always the top of the jitter range (deterministic tests)."""

    def delay(self, failures: int, *, rng: Any, retry_after: float | None = None) -> float:
        d = self.ceiling(failures)
        return d if retry_after is None else max(d, min(retry_after, self.max_hint_seconds))


def http2_frames(stream: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each HTTP/2 frame after the client preface.

    RFC 9113, Section 4.1: a 9-byte header (24-bit length, type, flags, 31-bit
    stream id) then the payload. Section 3.4: the client preface is 24 bytes.
    """
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    assert stream.startswith(preface)
    frames, i = [], len(preface)
    while i + 9 <= len(stream):
        length = int.from_bytes(stream[i : i + 3], "big")
        kind, flags = stream[i + 3], stream[i + 4]
        stream_id = int.from_bytes(stream[i + 5 : i + 9], "big") & 0x7FFFFFFF
        frames.append((kind, flags, stream_id, stream[i + 9 : i + 9 + length]))
        i += 9 + length
    assert i == len(stream), "truncated HTTP/2 frame"
    return frames


def ledger_rows(collector: RunningCollector) -> list[tuple[bytes, str, str]]:
    """(report_id, subject, payload JSON) of every report the collector stored."""
    import sqlalchemy as sa
    from fedldp.collector.ledger.schema import reports

    def tx(conn: sa.Connection) -> list[tuple[bytes, str, str]]:
        q = sa.select(reports.c.report_id, reports.c.subject, reports.c.payload)
        return [(bytes(r), str(s), str(p)) for r, s, p in conn.execute(q)]

    return collector.ledger.transaction(tx, write=False)


@contextlib.contextmanager
def running_deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A fresh authority and token secret; every collector it started is stopped after."""
    d = Deployment(tmp_path, int(time.time()))
    try:
        yield d
    finally:
        d.stop()
