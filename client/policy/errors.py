"""Policy and trust errors: one exception type per failure, each message says what to fix.

Every class derives from `PolicyError`, so a caller that only needs "refused or not"
catches that; a caller that maps failures to wire reasons (the collector) or to
user advice (the CLI) catches the specific type. Messages never contain a
user's value; they may contain policy ids, versions, key ids and times, which
are public policy metadata.
"""

from __future__ import annotations

from collections.abc import Sequence


class PolicyError(Exception):
    """Base of every policy verification or validation failure."""


class PayloadTypeError(PolicyError):
    """The envelope's payload type is not the one expected (e.g. a root given as a policy)."""


class BadSignatureError(PolicyError):
    """No valid signature by a trusted key over PAE(payload type, payload)."""


class UnknownKeyError(PolicyError):
    """The envelope is signed only by keys the trust store does not know."""


class ExpiredKeyError(PolicyError):
    """The signing key (or the root that delegates to it) has expired."""


class InvalidPolicyError(PolicyError):
    """The policy content is invalid; `problems` lists every problem found at once."""

    def __init__(self, problems: Sequence[str], *, subject: str = "policy") -> None:
        self.problems: list[str] = list(problems)
        listing = "; ".join(self.problems) if self.problems else "no details"
        super().__init__(
            f"{subject} is invalid ({len(self.problems)} problem(s)): {listing}; "
            "fix the source and sign it again"
        )


class ExpiredPolicyError(PolicyError):
    """The policy's validity interval ended (now >= expires_at)."""


class NotYetValidPolicyError(PolicyError):
    """The policy's validity interval has not started (now < not_before)."""


class RollbackError(PolicyError):
    """The policy's version is lower than the highest version already accepted."""


class EpsilonAboveMaximumError(PolicyError):
    """The policy asks for more epsilon than this device's configured maximum."""


class AudienceMismatchError(PolicyError):
    """The policy is not addressed to this collector deployment."""


class RootRotationError(PolicyError):
    """A root update or a pinned root does not satisfy the rotation rules (TUF)."""


class ConflictingPolicyError(PolicyError):
    """Two different signed payloads claim the same (policy id, version)."""


class WindowChangeError(PolicyError):
    """A version of a policy id declares another budget window length than the one
    this device (or collector) has spent under: versions of one policy id share one
    budget, keyed by window start, so the window cannot change."""
