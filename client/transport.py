"""The SDK's gRPC transport: channel, credentials, deadlines, retry hints, backoff.

Three rules shape this module:

1. **Stored bytes go on the wire unchanged.** `Transport.submit_raw` takes the
   serialized ``Report`` messages from the outbox and builds the
   ``SubmitRequest`` by concatenating them as its ``reports`` field (a repeated
   message field is the concatenation of its length-delimited elements, protobuf
   encoding spec, "Length-Delimited Records"; the field number comes from the
   generated descriptor), and hands those bytes to a generic unary call with no
   serializer. No message is parsed and re-serialized, so a retry sends exactly
   the bytes of the first attempt, and a stored row that no longer parses is
   refused by the collector (INVALID) instead of breaking the sender.
2. **No value- or timing-dependent request metadata.** Deadlines are enforced on
   the device (``future.result(timeout)`` then cancel), not sent as a
   ``grpc-timeout`` header whose text would depend on when the send started.
   The request headers are the method, the authority, the user agent and the
   bearer token: the same for every report.
3. **Retry hints are honoured, never trusted blindly.** A ``retry-after-ms``
   trailer on RESOURCE_EXHAUSTED or UNAVAILABLE sets a floor on the next delay,
   capped at `Backoff.max_hint_seconds` so a hostile server cannot park the
   device forever.

Backoff is exponential with "full jitter" (Brooker, "Exponential Backoff And
Jitter", AWS Architecture Blog, 2015): ``delay = uniform(0, min(cap, base·2^n))``
after the n-th consecutive failure, which spreads a fleet's retries evenly
instead of synchronizing them. The SDK keeps one such backoff per device and
collector (`fedldp.client.outbox.SendGate`); this module makes sure gRPC's own
connection backoff never stacks on top of it:

* calls are made with ``wait_for_ready=False``: a call on a channel that is in
  TRANSIENT_FAILURE fails at once instead of queueing behind gRPC's reconnect
  timer, so the SDK's schedule alone decides when a report is retried;
* a channel whose call failed without an answer (UNAVAILABLE or
  DEADLINE_EXCEEDED, no retry hint) is closed and replaced by a fresh one before
  the next call: a closed channel makes no reconnect attempts during the SDK's
  backoff, and the SDK's next attempt (a probe) makes exactly one new
  connection attempt, immediately, instead of failing fast until gRPC's own
  reconnect timer (up to 120 s by default) runs out;
* `channel_options` ties gRPC's reconnect backoff for a channel that stays up
  (e.g. after a GOAWAY) to the SDK's: ``grpc.initial_reconnect_backoff_ms`` =
  `Backoff.base_seconds`, ``grpc.max_reconnect_backoff_ms`` =
  `Backoff.max_seconds`, ``grpc.min_reconnect_backoff_ms`` (gRPC's minimum
  connect timeout) = the call timeout, ``grpc.enable_retries`` = 0 (gRPC's own
  retries off: the SDK's retries resend the stored bytes on its persisted
  schedule).
"""

from __future__ import annotations

import random
import secrets
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from fedldp.v1 import collector_pb2

_SERVICE = "/fedldp.v1.Collector/"

#: Status codes worth retrying with backoff: the call may succeed later unchanged.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
#: Trailing metadata key carrying the server's retry hint, in milliseconds.
RETRY_AFTER_KEY = "retry-after-ms"
#: Largest message the device accepts (policy domains may be large).
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Credentials:
    """How the device authenticates to the collector and authenticates the collector.

    * `token`: a bearer token sent as ``authorization: Bearer <token>`` on every
      call; the collector derives the privacy-budget subject from it.
    * TLS (the default): `root_certificates` (PEM; None = the system's roots) and,
      for mutual TLS, `private_key` + `certificate_chain` (PEM).
    * `insecure=True`: plaintext HTTP/2, for loopback tests and development only;
      a token sent this way is readable by anyone on the path.
    """

    token: str | None = None
    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.token is not None and (not self.token or any(c in self.token for c in "\r\n")):
            raise ValueError("token must be a non-empty single-line string")
        if (self.private_key is None) != (self.certificate_chain is None):
            raise ValueError("mutual TLS needs both private_key and certificate_chain")
        if self.insecure and (self.root_certificates or self.private_key):
            raise ValueError("insecure=True cannot be combined with TLS material")

    @classmethod
    def bearer(cls, token: str, *, root_certificates: bytes | None = None) -> Credentials:
        """A bearer token over TLS (system roots unless `root_certificates` is given)."""
        return cls(token=token, root_certificates=root_certificates)

    @classmethod
    def insecure_bearer(cls, token: str) -> Credentials:
        """A bearer token over plaintext: loopback tests and development only."""
        return cls(token=token, insecure=True)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Per-call metadata (the same bytes for every call)."""
        return () if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def __repr__(self) -> str:  # never print the token
        return (
            f"Credentials(token={'<set>' if self.token else None}, "
            f"tls={'off' if self.insecure else 'on'}, "
            f"mtls={'on' if self.private_key else 'off'})"
        )


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter (Brooker 2015), honouring retry hints."""

    base_seconds: float = 0.5
    max_seconds: float = 300.0
    max_hint_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.base_seconds <= self.max_seconds:
            raise ValueError("need 0 < base_seconds <= max_seconds")
        if self.max_hint_seconds < 0:
            raise ValueError("max_hint_seconds must be >= 0")

    def ceiling(self, failures: int) -> float:
        """The upper end of the jitter range after `failures` consecutive failures (>= 1)."""
        exponent = min(max(failures, 1) - 1, 62)
        return min(self.max_seconds, self.base_seconds * float(2**exponent))

    def delay(
        self, failures: int, *, rng: random.Random, retry_after: float | None = None
    ) -> float:
        """Seconds to wait before the next attempt.

        ``uniform(0, ceiling(failures))``, raised to the server's hint when one was
        given (hint capped at `max_hint_seconds`).
        """
        d = rng.uniform(0.0, self.ceiling(failures))
        if retry_after is not None:
            d = max(d, min(retry_after, self.max_hint_seconds))
        return d


def channel_options(backoff: Backoff, timeout_seconds: float) -> list[tuple[str, int]]:
    """The gRPC channel options that make gRPC's reconnect backoff follow the SDK's.

    See the module docstring: gRPC's reconnect delays start at the SDK's base
    delay and stop at its maximum, a connection attempt may take the whole call
    timeout, and gRPC does not retry calls itself.
    """
    return [
        ("grpc.initial_reconnect_backoff_ms", max(1, round(backoff.base_seconds * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(1, round(backoff.max_seconds * 1000))),
        ("grpc.min_reconnect_backoff_ms", max(1, round(timeout_seconds * 1000))),
        ("grpc.enable_retries", 0),
    ]


#: Failures after which the channel is replaced (no answer came from the server).
_CONNECTION_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def tls_hint(code: grpc.StatusCode, details: str) -> str:
    """`details`, plus what to check when a TLS handshake failed (a collector serving
    plaintext answers a TLS client's hello with garbage: WRONG_VERSION_NUMBER)."""
    if code == grpc.StatusCode.UNAVAILABLE and "handshake" in details.lower():
        return (
            f"{details} (TLS handshake failed: the collector may be serving plaintext; "
            "bearer tokens are only sent over TLS, so give the collector tls_cert and "
            "tls_key, or use its TLS address)"
        )
    return details


class TransportError(Exception):
    """A call failed as a whole; no report in it is known to be acknowledged.

    `code` is the gRPC status; `retry_after` the server's hint in seconds, if any;
    `transient` whether the same request may succeed later.
    """

    def __init__(self, code: grpc.StatusCode, detail: str, retry_after: float | None) -> None:
        super().__init__(f"{code.name}: {detail}")
        self.code = code
        self.detail = detail
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Whether retrying the identical call may succeed."""
        return self.code in TRANSIENT_CODES


def retry_after_seconds(metadata: Sequence[tuple[str, str | bytes]] | None) -> float | None:
    """The ``retry-after-ms`` hint in trailing metadata, in seconds (None if absent or bad)."""
    for key, value in metadata or ():
        if key.lower() != RETRY_AFTER_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if text.isdigit() and len(text) <= 12:
            return int(text) / 1000.0
    return None


def encode_varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf base-128 varint (encoding spec, "Base 128 Varints")."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


#: The key of ``SubmitRequest.reports``: its field number, read from the generated
#: descriptor, and wire type 2 (length-delimited).
_REPORTS_KEY = encode_varint(
    collector_pb2.SubmitRequest.DESCRIPTOR.fields_by_name["reports"].number << 3 | 2
)


def submit_request_bytes(reports: Sequence[bytes]) -> bytes:
    """A serialized ``SubmitRequest`` whose ``reports`` are exactly these serialized Reports.

    For each report in order: the field's key, the length as a varint, then the
    bytes (protobuf encoding: repeated embedded messages). Equal byte for byte
    to the generated code's ``SubmitRequest(reports=...).SerializeToString()``
    for every Report the SDK stores (tests/client/sdk/test_sdk_transport.py);
    unlike it, never parses the stored bytes (docs/performance.md says why).
    """
    return b"".join(_REPORTS_KEY + encode_varint(len(r)) + r for r in reports)


_Methods = tuple[
    "grpc.UnaryUnaryMultiCallable[Any, Any]",
    "grpc.UnaryUnaryMultiCallable[Any, Any]",
    "grpc.UnaryUnaryMultiCallable[Any, Any]",
]
_GET_POLICIES, _SUBMIT, _GET_BUDGET = 0, 1, 2
_shared_lock = threading.Lock()
_shared_methods: weakref.WeakKeyDictionary[grpc.Channel, _Methods] = weakref.WeakKeyDictionary()


def _methods(channel: grpc.Channel) -> _Methods:
    """The GetPolicies, Submit and GetBudget method handles on `channel`."""
    return (
        channel.unary_unary(
            _SERVICE + "GetPolicies",
            request_serializer=collector_pb2.GetPoliciesRequest.SerializeToString,
            response_deserializer=collector_pb2.GetPoliciesResponse.FromString,
        ),
        # No request serializer: the request *is* the stored bytes.
        channel.unary_unary(
            _SERVICE + "Submit",
            request_serializer=None,
            response_deserializer=collector_pb2.SubmitResponse.FromString,
        ),
        channel.unary_unary(
            _SERVICE + "GetBudget",
            request_serializer=collector_pb2.GetBudgetRequest.SerializeToString,
            response_deserializer=collector_pb2.GetBudgetResponse.FromString,
        ),
    )


class Transport:
    """A gRPC channel to one collector and the three calls the SDK makes.

    Thread-safe (gRPC channels are). Each Client owns one Transport, with a
    private subchannel pool, so its connection is its own and `close()` ends it.
    """

    def __init__(
        self,
        target: str,
        credentials: Credentials,
        *,
        timeout_seconds: float = 30.0,
        options: Sequence[tuple[str, int | str]] = (),
        channel: grpc.Channel | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """Dial `target`, or use `channel` if given.

        A given `channel` is shared, not owned: `close()` leaves it open and it is
        never replaced. It is for simulations that run many devices in one
        process (each device keeps its own credentials, state and outbox; only
        the HTTP/2 connection is shared). A real device passes nothing and gets a
        connection of its own, with `channel_options(backoff, timeout_seconds)`.
        """
        if not target or any(c.isspace() for c in target):
            raise ValueError("collector must be a 'host:port' target without spaces")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.target = target
        self.credentials = credentials
        self.timeout_seconds = timeout_seconds
        self.options: list[tuple[str, int | str]] = [
            ("grpc.use_local_subchannel_pool", 1),
            *channel_options(backoff or Backoff(), timeout_seconds),
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            # No bandwidth-delay probes: reports are small, and fewer timing-driven
            # PING frames leave less on the wire that is not the request itself.
            ("grpc.http2.bdp_probe", 0),
            *options,
        ]
        self._metadata = credentials.metadata()
        self._owns_channel = channel is None
        self._channel_lock = threading.Lock()
        self._closed = False
        #: How many channels this Transport has opened (the first included).
        self.channels_opened = 0
        if channel is not None:
            self._channel = channel
            # Shared channel: its method handles carry no credentials (the bearer
            # token travels in each call's metadata), so Transports share them.
            with _shared_lock:
                methods = _shared_methods.get(channel)
                if methods is None:
                    methods = _shared_methods[channel] = _methods(channel)
            self._methods = methods
        else:
            self._channel, self._methods = self._open()

    def _open(self) -> tuple[grpc.Channel, _Methods]:
        """A new channel of our own, and its method handles."""
        self.channels_opened += 1
        if self.credentials.insecure:
            channel = grpc.insecure_channel(self.target, options=self.options)
        else:
            channel_credentials = grpc.ssl_channel_credentials(
                root_certificates=self.credentials.root_certificates,
                private_key=self.credentials.private_key,
                certificate_chain=self.credentials.certificate_chain,
            )
            channel = grpc.secure_channel(self.target, channel_credentials, options=self.options)
        return channel, _methods(channel)

    def _replace_channel(self, failed: grpc.Channel) -> None:
        """Close `failed` (if still current and ours) and open a fresh channel.

        The new channel is idle until the next call, which then makes one
        connection attempt at once (see the module docstring).
        """
        with self._channel_lock:
            if not self._owns_channel or self._closed or self._channel is not failed:
                return
            self._channel, self._methods = self._open()
        failed.close()

    def _call(self, index: int, request: object) -> object:
        with self._channel_lock:
            if self._closed:
                raise TransportError(grpc.StatusCode.CANCELLED, "the transport is closed", None)
            channel, method = self._channel, self._methods[index]
        future = method.future(request, metadata=self._metadata, wait_for_ready=False)
        try:
            return future.result(timeout=self.timeout_seconds)
        except grpc.FutureTimeoutError:
            future.cancel()  # type: ignore[no-untyped-call]
            self._replace_channel(channel)
            raise TransportError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer within {self.timeout_seconds} s",
                None,
            ) from None
        except grpc.RpcError as exc:
            call: grpc.Call = exc  # type: ignore[assignment]
            error = TransportError(
                call.code(),
                tls_hint(call.code(), call.details() or ""),
                retry_after_seconds(call.trailing_metadata()),
            )
            if error.code in _CONNECTION_FAILURES and error.retry_after is None:
                self._replace_channel(channel)
            raise error from None

    def get_policies(
        self, *, known_root_version: int = 0, metric: str = ""
    ) -> collector_pb2.GetPoliciesResponse:
        """The collector's active policy envelopes and any newer roots."""
        request = collector_pb2.GetPoliciesRequest(
            metric=metric, known_root_version=known_root_version
        )
        response = self._call(_GET_POLICIES, request)
        assert isinstance(response, collector_pb2.GetPoliciesResponse)
        return response

    def submit_raw(self, reports: Sequence[bytes]) -> collector_pb2.SubmitResponse:
        """Submit serialized Reports exactly as given; one outcome per report expected."""
        response = self._call(_SUBMIT, submit_request_bytes(reports))
        assert isinstance(response, collector_pb2.SubmitResponse)
        return response

    def get_budget(self, policy_id: str = "") -> collector_pb2.GetBudgetResponse:
        """What the collector's ledger says this device's subject has left."""
        response = self._call(_GET_BUDGET, collector_pb2.GetBudgetRequest(policy_id=policy_id))
        assert isinstance(response, collector_pb2.GetBudgetResponse)
        return response

    def close(self) -> None:
        """Close the channel if this Transport opened it (idempotent)."""
        with self._channel_lock:
            if self._closed:
                return
            self._closed = True
        if self._owns_channel:
            self._channel.close()


def jitter_rng() -> random.Random:
    """The randomness for backoff jitter: the OS CSPRNG (unpredictable retry times)."""
    return secrets.SystemRandom()


__all__ = [
    "RETRY_AFTER_KEY",
    "TRANSIENT_CODES",
    "Backoff",
    "Credentials",
    "Transport",
    "TransportError",
    "channel_options",
    "encode_varint",
    "jitter_rng",
    "retry_after_seconds",
    "submit_request_bytes",
]
