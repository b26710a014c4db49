"""Charges made under a retired rule: which subjects' past spend is below the sound figure.

The ledger stores every report's charge as it was made (`reports.charge`) and
never rewrites it. When the charging rule of a mechanism changes — the
memoized mechanisms moved from the retired r* rule to the sound sequence
charge max(ε1, ε_I) (client/mechanisms/memo.py) — reports charged before the
change cost less than the proven bound on what they may have lost. This
module finds them, per (subject, policy, window), from the raw rows and the
policies' own payloads (matched by digest, so the figure is that of exactly
the content the reports were charged under). It reports; it changes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

import sqlalchemy as sa
from fedldp.collector.ledger.engine import LedgerCore
from fedldp.collector.ledger.model import EXACT, _dec
from fedldp.collector.ledger.schema import reports
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError


@dataclass(frozen=True)
class ChargeGroup:
    """The reports of one (subject, policy version, digest, window) charged at one rate."""

    subject: str
    policy_id: str
    policy_version: int
    policy_digest: bytes
    window_start: int
    charge: Decimal
    reports: int


@dataclass(frozen=True)
class Undercharge:
    """One subject window whose recorded spend is below the sound rule's figure."""

    subject: str
    policy_id: str
    window_start: int
    reports: int
    spent: Decimal  # what the ledger charged (the retired rule's figure)
    sound: Decimal | None  # the sound rule's figure for the same reports; None: unbounded

    def __str__(self) -> str:
        head = (
            f"subject={self.subject} policy={self.policy_id} window={self.window_start}: "
            f"{self.reports} report(s) charged {self.spent} under the retired r* rule; "
        )
        if self.sound is None:
            return head + (
                "no finite charge covers them (epsilon = epsilon_permanent: a change of "
                "value is revealed with certainty)"
            )
        return head + (
            f"the sound rule's figure is {self.sound} (not in the ledger: "
            f"{EXACT.subtract(self.sound, self.spent)} more)"
        )


class ChargeAudit(LedgerCore):
    """Read the charge groups of every stored report (read-only)."""

    def charge_groups(self) -> list[ChargeGroup]:
        """Every (subject, policy id, version, digest, window, charge) with its report count."""
        return self.transaction(_charge_groups_tx, write=False)


def _charge_groups_tx(conn: sa.Connection) -> list[ChargeGroup]:
    keys = (
        reports.c.subject,
        reports.c.policy_id,
        reports.c.policy_version,
        reports.c.policy_digest,
        reports.c.window_start,
        reports.c.charge,
    )
    query = sa.select(*keys, sa.func.count().label("n")).group_by(*keys)
    return [
        ChargeGroup(s, p, int(v), bytes(d), int(w), _dec(c), int(n))
        for s, p, v, d, w, c, n in conn.execute(query)
    ]


def sound_charges(payloads: Iterable[bytes]) -> dict[bytes, Decimal | None]:
    """Policy digest -> the sound per-report charge of that exact content (None: unbounded).

    `payloads` are serialized Policy messages (an envelope's payload); the digest
    is the one reports record (SHA-256 of the payload). None marks a memoized
    policy this release refuses because no finite charge covers it (ε1 = ε∞: its
    instantaneous step is deterministic, so a change of value is revealed with
    certainty). Payloads that do not decode or build for another reason are left
    out; their reports are `unjudged`.
    """
    from fedldp.client.mechanisms import create
    from fedldp.client.mechanisms.memo_loss import InfiniteSequenceLossError
    from fedldp.client.policy import policy_digest
    from fedldp.client.policy.validation import metric_argument, parse_decimal

    out: dict[bytes, Decimal | None] = {}
    for payload in payloads:
        try:
            message = policy_pb2.Policy.FromString(payload)
            metric = metric_argument(message)
            epsilon = parse_decimal(message.mechanism.epsilon)
            if metric is None:
                continue
            mechanism = create(
                message.mechanism.id, epsilon, metric, dict(message.mechanism.params)
            )
        except InfiniteSequenceLossError:
            out[policy_digest(payload)] = None
            continue
        except (DecodeError, ValueError, TypeError, KeyError):
            continue
        out[policy_digest(payload)] = mechanism.report_charge
    return out


def unjudged(
    groups: Iterable[ChargeGroup], charges: Mapping[bytes, Decimal | None]
) -> dict[tuple[str, int], int]:
    """(policy id, version) -> reports whose policy digest is not in `charges`.

    Their charge cannot be judged against the sound rule without the exact
    policy they were charged under (add its envelope to the folder).
    """
    out: dict[tuple[str, int], int] = defaultdict(int)
    for g in groups:
        if g.policy_digest not in charges:
            out[(g.policy_id, g.policy_version)] += g.reports
    return dict(sorted(out.items()))


def undercharged(
    groups: Iterable[ChargeGroup], charges: Mapping[bytes, Decimal | None]
) -> list[Undercharge]:
    """Subject windows whose reports were charged below the sound rule, summed exactly.

    A group counts when its policy digest is in `charges` and its recorded
    per-report charge is below that policy's sound charge, or the sound charge
    is unbounded (None): then the window's `sound` is None.
    """
    spent: dict[tuple[str, str, int], Decimal] = defaultdict(Decimal)
    figure: dict[tuple[str, str, int], Decimal | None] = defaultdict(Decimal)
    count: dict[tuple[str, str, int], int] = defaultdict(int)
    for g in groups:
        if g.policy_digest not in charges:
            continue
        sound = charges[g.policy_digest]
        if sound is not None and g.charge >= sound:
            continue
        key = (g.subject, g.policy_id, g.window_start)
        spent[key] = EXACT.add(spent[key], EXACT.multiply(g.charge, g.reports))
        so_far = figure[key]
        figure[key] = (
            None
            if sound is None or so_far is None
            else EXACT.add(so_far, EXACT.multiply(sound, g.reports))
        )
        count[key] += g.reports
    return [
        Undercharge(s, p, w, count[(s, p, w)], spent[(s, p, w)], figure[(s, p, w)])
        for (s, p, w) in sorted(count)
    ]


__all__ = [
    "ChargeAudit",
    "ChargeGroup",
    "Undercharge",
    "sound_charges",
    "undercharged",
    "unjudged",
]
