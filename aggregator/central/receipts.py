"""Signed receipts of central releases, and their verification against the ledger.

`release_receipt` describes one settled release (schema
"fedldp.release-receipt/v1", documented in docs/aggregator.md) from the ledger
itself: the ledger's identity, the reservation (id, owner, subject, purpose,
reserved and spent ε and δ), the events (mechanism, noise parameters, the
released output, the keyed HMAC-SHA256 of the data file recorded at release
time: datakey.py, never a plain hash of protected data), the
libraries and the randomness source. `fedldp release ... --receipt PATH
--signing-key KEY` signs it (signing.py, DSSE envelope);
`verify_release_receipt` (`fedldp verify release`) checks, each with its own
message: the signature, the ledger's identity, the reservation (settled, same
owner and amounts), the receipt key the reservation binds (only that key may
sign its receipt, `check_receipt_key`), the events against the ledger's, the released value
against the events, the accountant replayed on the events, the randomness
(seeded releases are not for release unless accepted) and, given the data
file and the secret data-digest key, the data binding (without the key the
binding is reported as not checked).
"""

from __future__ import annotations

import functools
import hashlib
import io
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.aggregator.central.datakey import ALGORITHM, DataKey
from fedldp.aggregator.central.signing import (
    RELEASE_RECEIPT_TYPE,
    SignatureError,
    is_envelope,
    payload_of,
    read_json,
    verify,
)

SCHEMA = "fedldp.release-receipt/v1"
#: Slack of a PLD replay against a calibrated (ε, δ) (PLD discretization, pessimistic).
PLD_SLACK = 1e-3


class ReleaseReceiptError(ValueError):
    """The file is not a release receipt at all (unreadable, not JSON, other schema)."""


@dataclass(frozen=True)
class Check:
    """One verification step and its outcome."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


@dataclass
class Verification:
    """All checks of one receipt; `ok` when none failed (skipped ones are listed)."""

    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check that ran failed (skipped checks do not count)."""
        return all(c.ok for c in self.checks if not c.skipped)

    def add(self, name: str, ok: bool, detail: str, *, skipped: bool = False) -> None:
        """Record one check's result (`skipped`: not run, e.g. no key to check with)."""
        self.checks.append(Check(name, ok, detail, skipped))

    def failures(self) -> dict[str, str]:
        """{check name: message} of the failed checks."""
        return {c.name: c.detail for c in self.checks if not c.ok and not c.skipped}


class ReceiptLedger(Protocol):
    """What receipts read from the ledger (fedldp.collector.ledger.Ledger)."""

    def ledger_id(self) -> str:
        """See `Ledger.ledger_id`."""
        ...

    def reservation(self, reservation_id: str) -> Any:
        """See `Ledger.reservation`."""
        ...

    def central_events(self, subject: str, purpose: str) -> Sequence[Any]:
        """See `Ledger.central_events`."""
        ...


CENTRAL_LIBRARIES = ("fedldp", "dp-accounting", "numpy", "scipy", "cryptography")


def library_versions(names: tuple[str, ...] = CENTRAL_LIBRARIES) -> dict[str, str]:
    """Versions of Python and of `names` (what shapes a result, for its receipt);
    "not installed" for a missing distribution. Read once per process and set of
    names (reading distribution metadata costs tens of ms on every release
    otherwise); each call returns a fresh dict."""
    return dict(_library_versions(names))


@functools.lru_cache(maxsize=16)
def _library_versions(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`library_versions`' pairs, cached: the installed versions do not change
    under a running process (an upgrade takes effect at its restart)."""
    out = [("python", platform.python_version())]
    for name in names:
        try:
            out.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append((name, "not installed"))
    return tuple(out)


def file_sha256(path: Path) -> str:
    """Lowercase hex SHA-256 of a file's bytes (confidential: only ever published keyed)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class HashingReader(io.RawIOBase):
    """A raw binary stream over `fh` that feeds every byte it hands out to `digest`.

    Wrapped in `io.BufferedReader` (and a text wrapper), a parser reading through it
    hashes exactly the bytes it consumed, in one pass; `digest` (a hashlib object) is
    complete only once the stream was read to its end, which the caller ensures.
    """

    def __init__(self, fh: io.BufferedReader, digest: Any) -> None:
        self._fh, self._digest = fh, digest

    def readable(self) -> bool:
        """Always True: the stream is read-only."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Fill `buffer` from `fh`, hash what was read; the byte count (0 at the end)."""
        n = self._fh.readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
        return n or 0


def _events_of(ledger: ReceiptLedger, res: Any) -> list[dict[str, Any]]:
    """The events the ledger stores for the reservation `res`: read from its own row
    when the ledger offers `release_events` (one read, whatever its subject's history),
    else picked from every event of its (subject, purpose)."""
    one = getattr(ledger, "release_events", None)
    if one is not None:
        return [dict(e.event) for e in one(res.id)[1]]
    return [
        dict(e.event)
        for e in ledger.central_events(res.subject, res.purpose)
        if e.reservation_id == res.id
    ]


def _reservation_and_events(
    ledger: ReceiptLedger, reservation_id: str
) -> tuple[Any, list[dict[str, Any]]]:
    """The reservation and its stored events: one read of its row when the ledger
    offers `release_events`, else `reservation` then `_events_of`."""
    one = getattr(ledger, "release_events", None)
    if one is not None:
        res, events = one(reservation_id)
        return res, [dict(e.event) for e in events]
    res = ledger.reservation(reservation_id)
    return res, _events_of(ledger, res) if res.status == "settled" else []


def release_receipt(
    ledger: ReceiptLedger,
    reservation_id: str,
    *,
    value: str,
    randomness: str = "os-csprng",
) -> dict[str, Any]:
    """The receipt of a settled release, built from the ledger (module docstring).

    The randomness source is the one the ledger's events record (releases.py
    stores it in each event): "os-csprng" for the production path, "seeded"
    when the caller passed its own generator, "unknown" for events that do not
    say. Only "os-csprng" is for release. `randomness` (kept for callers of the
    earlier signature) can only make a receipt more conservative: "seeded"
    marks it not for release whatever the ledger says.
    """
    res, events = _reservation_and_events(ledger, reservation_id)
    if res.status != "settled":
        raise ValueError(f"reservation {reservation_id} is {res.status}: nothing was released")
    source = _recorded_randomness(events)
    if randomness != "os-csprng":
        source = "seeded"
    bindings = sorted(
        {
            (str(e["data_hmac_sha256"]), str(e.get("data_key_id")))
            for e in events
            if "data_hmac_sha256" in e
        }
    )
    return {
        "schema": SCHEMA,
        "kind": res.metadata.get("kind"),
        "value": value,
        "ledger": {
            "ledger_id": ledger.ledger_id(),
            "reservation_id": res.id,
            "owner": res.owner,
            "subject": res.subject,
            "purpose": res.purpose,
            "idempotency_key": res.idempotency_key,
            "metadata": dict(res.metadata),
            "epsilon_reserved": str(res.epsilon),
            "delta_reserved": str(res.delta),
            "epsilon_spent": str(res.epsilon_spent),
            "delta_spent": str(res.delta_spent),
        },
        "events": events,
        "data": _data_binding(bindings),
        "libraries": library_versions(),
        "randomness": {"source": source},
        "for_release": source == "os-csprng",
    }


def _recorded_randomness(events: Sequence[Mapping[str, Any]]) -> str:
    """The randomness source the events record: their common value, else "unknown"."""
    sources = {str(e.get("randomness", "unknown")) for e in events}
    return sources.pop() if len(sources) == 1 else "unknown"


def _data_binding(bindings: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The receipt's `data` object: the keyed digest of the data (datakey.py), or nulls."""
    mac, key_id = bindings[0] if len(bindings) == 1 else (None, None)
    return {"algorithm": ALGORITHM, "hmac_sha256": mac, "key_id": key_id}


# --- verification ---


def verify_release_receipt(
    path: Path,
    *,
    trusted: Mapping[str, Ed25519PublicKey],
    ledger: ReceiptLedger,
    accept_seeded: bool = False,
    data_path: Path | None = None,
    data_key: DataKey | None = None,
) -> Verification:
    """Verify a signed release receipt (module docstring); never raises on a failed check.

    Raises ReleaseReceiptError only when the file is not a release receipt at all.
    """
    try:
        document = read_json(path)
    except (OSError, ValueError) as exc:
        raise ReleaseReceiptError(f"cannot read {path}: {exc}") from exc
    out = Verification()
    if is_envelope(document):
        try:
            receipt = payload_of(document)
        except SignatureError as exc:
            raise ReleaseReceiptError(f"{path}: {exc}") from exc
        try:
            _, signer = verify(document, RELEASE_RECEIPT_TYPE, trusted)
            out.add("signature", True, f"signed by trusted receipt key {signer}")
        except SignatureError as exc:
            out.add("signature", False, str(exc))
    else:
        receipt = document
        out.add("signature", False, "the receipt is not signed (plain JSON, no envelope)")
    if not isinstance(receipt, dict) or receipt.get("schema") != SCHEMA:
        raise ReleaseReceiptError(f"{path} is not a {SCHEMA} receipt")
    signed = Signed(document if is_envelope(document) else None, RELEASE_RECEIPT_TYPE, trusted)
    res = _check_reservation(out, receipt, ledger, signed)
    if res is not None:
        _check_query(out, receipt, res)
        _check_events(out, receipt, ledger, res)
    _check_value(out, receipt)
    _replay(out, receipt)
    _check_randomness(out, receipt, accept_seeded)
    _check_data(out, receipt, data_path, data_key)
    return out


@dataclass(frozen=True)
class Signed:
    """How a receipt reached the verifier: its DSSE envelope (None: plain JSON), the
    payload type it must have, and the keys the verifier was told to trust."""

    envelope: Mapping[str, Any] | None
    payload_type: str
    trusted: Mapping[str, Ed25519PublicKey]


def check_receipt_key(out: Verification, res: Any, signed: Signed) -> None:
    """Adds "receipt key": the receipt is signed by the key its reservation binds.

    The ledger records, when the run reserves, the key id of the only key that
    may sign its receipt (`Ledger.reserve`, `receipt_key_id`), so a receipt
    re-signed by any other key fails here even when the verifier trusts that
    key; the bound key must itself be among the trusted keys. A reservation
    that recorded "" (its run signs no receipt) fails. A reservation made
    before the ledger recorded keys (NULL: migration 0007) is reported as
    skipped: only the trusted-key signature check applies to it.
    """
    bound = getattr(res, "receipt_key_id", None)
    if bound is None:
        out.add(
            "receipt key",
            True,
            "not bound: the reservation predates receipt-key binding (ledger migration 0007), "
            "so any --trusted-key may have signed it",
            skipped=True,
        )
        return
    if bound == "":
        out.add(
            "receipt key",
            False,
            "the run recorded in the ledger that it signs no receipt; this one was made later",
        )
        return
    key = signed.trusted.get(bound)
    if signed.envelope is None or key is None:
        why = "the receipt is not signed" if signed.envelope is None else "it is not trusted"
        out.add(
            "receipt key",
            False,
            f"the ledger binds this reservation's receipt to key {bound[:16]}…, but {why} "
            "(pass its public key with --trusted-key)",
        )
        return
    try:
        verify(signed.envelope, signed.payload_type, {bound: key})
    except SignatureError:
        out.add(
            "receipt key",
            False,
            f"not signed by key {bound[:16]}…, the only key the ledger allows for this "
            "reservation's receipt (re-signed by another key, even a trusted one, is refused)",
        )
        return
    out.add("receipt key", True, f"signed by {bound[:16]}…, the key the ledger binds")


def check_reservation(
    out: Verification,
    led: Mapping[str, Any],
    ledger: ReceiptLedger,
    amounts: Callable[[Any], Mapping[str, tuple[object, Decimal | None]]],
    signed: Signed,
) -> Any | None:
    """The receipt's ledger section against the ledger: identity, the reservation, the
    key bound to it.

    Adds "ledger identity", "reservation" and "receipt key" (`check_receipt_key`)
    to `out`. The reservation must exist, be settled, have the receipt's owner
    and (subject, purpose), and match every entry of `amounts(reservation)`
    (name -> (the receipt's value, the ledger's value)). Returns the reservation
    row, or None when the ledger has none with the receipt's id. Shared by
    release and training receipts (aggregator/training/receipt.py).
    """
    from fedldp.collector.ledger import ReservationNotFoundError

    here = ledger.ledger_id()
    out.add(
        "ledger identity",
        led.get("ledger_id") == here,
        f"ledger {here}"
        if led.get("ledger_id") == here
        else f"the receipt names ledger {led.get('ledger_id')!r}, this ledger is {here}",
    )
    rid = str(led.get("reservation_id"))
    try:
        res = ledger.reservation(rid)
    except ReservationNotFoundError:
        out.add("reservation", False, f"no reservation {rid!r} in this ledger")
        return None
    problems = []
    if res.status != "settled":
        problems.append(f"it is {res.status}, not settled")
    if res.owner != led.get("owner"):
        problems.append("its owner is not the run named in this receipt")
    if (res.subject, res.purpose) != (led.get("subject"), led.get("purpose")):
        problems.append(f"it charges ({res.subject}, {res.purpose}), not the receipt's")
    for name, (claimed, recorded) in amounts(res).items():
        if recorded is None or _decimal(claimed) != recorded:
            problems.append(f"receipt {name} {claimed} != ledger's {recorded}")
    out.add(
        "reservation",
        not problems,
        f"{rid} settled, same owner and amounts"
        if not problems
        else f"{rid}: " + "; ".join(problems),
    )
    check_receipt_key(out, res, signed)
    return res


def _check_reservation(
    out: Verification, receipt: dict[str, Any], ledger: ReceiptLedger, signed: Signed
) -> Any | None:
    led = receipt.get("ledger", {})
    return check_reservation(
        out,
        led,
        ledger,
        lambda res: {
            "epsilon_reserved": (led.get("epsilon_reserved"), res.epsilon),
            "delta_reserved": (led.get("delta_reserved"), res.delta),
            "epsilon_spent": (led.get("epsilon_spent"), res.epsilon_spent),
            "delta_spent": (led.get("delta_spent"), res.delta_spent),
        },
        signed,
    )


def _check_query(out: Verification, receipt: dict[str, Any], res: Any) -> None:
    """The receipt's query (kind, bounds, and the caller's parameters such as the column,
    recorded as "query.<name>" in the reservation's metadata) is the ledger's."""
    meta = dict(res.metadata)
    same = receipt.get("ledger", {}).get("metadata") == meta
    params = ", ".join(
        f"{k.removeprefix('query.')}={v}" for k, v in sorted(meta.items()) if k.startswith("query.")
    )
    shown = f"{meta.get('kind')}" + (f" ({params})" if params else "")
    out.add(
        "query",
        same,
        f"{shown}, as the ledger's reservation records it"
        if same
        else "the receipt's query (kind, column, bounds) differs from the ledger's reservation",
    )


def _check_events(
    out: Verification, receipt: dict[str, Any], ledger: ReceiptLedger, res: Any
) -> None:
    recorded = _events_of(ledger, res)
    same = recorded == receipt.get("events")
    out.add(
        "events",
        same,
        f"{len(recorded)} event(s) as in the ledger (mechanism, noise, output)"
        if same
        else "the receipt's events (mechanism, noise parameters or outputs) differ from the "
        "ledger's",
    )


def _check_value(out: Verification, receipt: dict[str, Any]) -> None:
    """The released value follows from the events' outputs (mean: `releases.mean_of`)."""
    events = {str(e.get("query")): e for e in receipt.get("events", [])}
    kind, value = receipt.get("kind"), receipt.get("value")
    try:
        if kind == "grouped":
            from fedldp.aggregator.central.grouped import aggregates_of, table_of
            from fedldp.aggregator.central.signing import canonical_json

            meta = receipt["ledger"]["metadata"]
            table = table_of(receipt.get("events", []), aggregates_of(meta))
            ok = canonical_json(table).decode() == str(value)
        elif kind == "mean":
            from fedldp.aggregator.central.releases import mean_of

            meta = receipt["ledger"]["metadata"]
            lower, upper = Decimal(meta["lower"]), Decimal(meta["upper"])
            centred = "centred_sum" in events  # releases recorded before it: "sum"
            noisy_sum = Decimal(str(events["centred_sum" if centred else "sum"]["output"]))
            noisy_count = Decimal(str(events["count"]["output"]))
            expected = mean_of(noisy_sum, noisy_count, lower, upper, centred=centred)
            ok = Decimal(str(value)) == expected
        else:
            ok = str(events[str(kind)]["output"]) == str(value)
    except (KeyError, ArithmeticError, TypeError):
        ok = False
    out.add(
        "value",
        ok,
        f"{kind} {value} follows from the recorded outputs"
        if ok
        else f"the released value {value!r} does not follow from the recorded outputs",
    )


def _event_epsilon(event: Mapping[str, Any]) -> Fraction:
    """The ε an event's own parameters give (pure kinds exactly; Gaussian kinds by PLD)."""
    from fedldp.aggregator.central.accounting import events_epsilon

    kind = event.get("kind")
    if kind == "discrete_laplace":
        return Fraction(int(event["lattice_sensitivity"])) / Fraction(str(event["scale"]))
    if kind == "exponential":
        return Fraction(str(event["epsilon"]))
    if kind == "threshold":
        return Fraction(int(event["lattice_sensitivity"])) / Fraction(str(event["scale"]))
    eps = events_epsilon([event], "pld", float(Decimal(str(event["delta"]))))
    return Fraction(eps) - Fraction(PLD_SLACK)


def _replay(out: Verification, receipt: dict[str, Any]) -> None:
    """Each event's parameters give at most its recorded ε; Σ of events ≤ the charge."""
    from fedldp.aggregator.central.accounting import CompositionError

    events = receipt.get("events", [])
    spent = _decimal(receipt.get("ledger", {}).get("epsilon_spent"))
    problems = []
    total = Fraction(0)
    try:
        for e in events:
            claimed = Fraction(str(e["epsilon"]))
            total += claimed
            if _event_epsilon(e) > claimed:
                problems.append(f"{e.get('kind')} noise gives more than its epsilon {claimed}")
    except (CompositionError, KeyError, ValueError, ZeroDivisionError) as exc:
        problems.append(f"cannot replay: {exc}")
    if spent is None or total > Fraction(spent):
        problems.append(f"events' epsilon {float(total)} exceeds the charge {spent}")
    if not events:
        problems.append("no events to replay")
    out.add(
        "accountant replay",
        not problems,
        f"every event's noise gives at most its epsilon; total {float(total)} <= {spent}"
        if not problems
        else "; ".join(problems),
    )


def _check_randomness(out: Verification, receipt: dict[str, Any], accept_seeded: bool) -> None:
    """From the events (checked equal to the ledger's): for release only if every event
    records the OS CSPRNG and the receipt says the same."""
    source = receipt.get("randomness", {}).get("source")
    recorded = _recorded_randomness(receipt.get("events", []))
    if source != recorded:
        out.add(
            "randomness",
            False,
            f"the receipt says randomness {source!r}, the ledger's events record {recorded!r}",
        )
    elif source == "os-csprng" and receipt.get("for_release") is True:
        out.add("randomness", True, "os-csprng: for release")
    elif accept_seeded:
        out.add("randomness", True, f"{source}: NOT for release (accepted with --accept-seeded)")
    else:
        out.add(
            "randomness",
            False,
            f"randomness {source!r}: a seeded release is not for release "
            "(pass --accept-seeded to accept it, for tests only)",
        )


def _check_data(
    out: Verification, receipt: dict[str, Any], data_path: Path | None, key: DataKey | None
) -> None:
    """The keyed data binding: needs the data file and the secret data-digest key."""
    data = receipt.get("data") or {}
    claimed = data.get("hmac_sha256")
    recorded = {e.get("data_hmac_sha256") for e in receipt.get("events", [])}
    if data_path is None or key is None:
        missing = " and ".join(
            n for n, v in (("--data FILE", data_path), ("--data-key KEY", key)) if v is None
        )
        out.add("data", True, f"data binding not checked (needs {missing})", skipped=True)
        return
    if claimed is None:
        out.add("data", False, "the receipt records no data binding (released without a key)")
        return
    if data.get("key_id") != key.key_id:
        out.add(
            "data",
            False,
            f"the receipt was bound with data key {data.get('key_id')}, not {key.key_id}",
        )
        return
    digest = file_sha256(data_path)
    ok = key.matches("file", digest, claimed) and recorded == {claimed}
    out.add(
        "data",
        ok,
        "the file matches the receipt's keyed digest"
        if ok
        else "the file does not match the receipt's keyed digest (or the ledger's)",
    )


def _decimal(value: object) -> Decimal | None:
    try:
        return Decimal(str(value))
    except ArithmeticError:
        return None
