"""The collector's request-level domain errors and their gRPC status codes.

`STATUS` is the one table mapping a domain error to a gRPC status code (per-report
problems are not errors: they are Outcomes and RejectReasons in the response).
Every error's message is safe to send: it never contains a payload, a token or a
raw value.
"""

from __future__ import annotations

import grpc


class CollectorError(Exception):
    """Base of request-level errors; `metadata` goes out as trailing metadata.

    `subject` is the authenticated caller when known (for the log's hashed tag
    only; never sent, never logged as it is).
    """

    def __init__(
        self,
        message: str,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        subject: str = "",
    ) -> None:
        super().__init__(message)
        self.metadata = metadata
        self.subject = subject


class UnauthenticatedError(CollectorError):
    """No credentials, or credentials that do not verify (forged, expired)."""


class RateLimitedError(CollectorError):
    """The subject sent more requests per second than allowed; retry after the hint."""


class OverloadedError(CollectorError):
    """The collector is at its limit of RPCs in progress or request bytes in flight;
    retry after the hint (nothing of the request was read)."""


class BodyTimeoutError(OverloadedError):
    """An admitted request did not send its body within the body deadline
    (`body_timeout_ms`): its reservation was released; retry after the hint."""


class SubjectShareError(OverloadedError):
    """The caller's subject already holds its share of the request bytes in flight
    (`max_subject_inflight_bytes`); retry after the hint."""


class BatchTooLargeError(CollectorError):
    """More reports in one request than the collector accepts."""


class MalformedRequestError(CollectorError):
    """The request bytes are not a valid message of the method's type."""


class ShuttingDownError(CollectorError):
    """The collector is draining; retry against another replica or later."""


class LedgerUnavailableError(CollectorError):
    """The ledger database failed; nothing was committed for this request."""


class SubjectSplitRefusedError(CollectorError):
    """The subject's charges are on two ledger shards (collector/ledger/shards.py):
    refused until an operator resolves it; a retry does not help."""


#: The one table: domain error -> gRPC status code.
STATUS: dict[type[CollectorError], grpc.StatusCode] = {
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    RateLimitedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    BatchTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MalformedRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    ShuttingDownError: grpc.StatusCode.UNAVAILABLE,
    LedgerUnavailableError: grpc.StatusCode.UNAVAILABLE,
    SubjectSplitRefusedError: grpc.StatusCode.FAILED_PRECONDITION,
}


def status_of(error: CollectorError) -> grpc.StatusCode:
    """The gRPC status code for `error` (by the most specific class in STATUS)."""
    for cls in type(error).__mro__:
        code = STATUS.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL
