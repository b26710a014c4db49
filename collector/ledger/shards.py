"""A privacy ledger spread over several databases (ledger shards), routed by subject.

Placement. A subject's *slot* is the first 8 bytes of SHA-256 of its UTF-8 id, as
a big-endian integer, modulo `SLOTS` (`slot_of`). The *shard map* says which
shard owns each slot; it is stored, identical, in every shard's ``ledger_info``
table (key ``shard_map``) with the ledger id of every shard in order, so a
collector whose URL list is incomplete, reordered or names another database
refuses to start (`ShardMapError`). The map is a list of *epochs*: epoch 0 gives
slot ``s`` to shard ``s mod N``; adding a shard appends an epoch that moves slots
to the new shard only (`ShardMap.add_shard`).

Rule: a subject's charges and reports live on exactly one shard, for ever. A
subject whose slot never moved lives on its slot's owner. For a slot that moved,
the subject lives on the earlier owner that holds spend rows of it (it was seen
before the move), else on the slot's current owner (a subject never seen). The
router looks this up once per subject (and caches it); finding spend rows of one
subject on two shards raises `SubjectSplitError` and charges nothing. So the
per-subject cap stays a single-shard transaction (store.py's invariants hold per
shard unchanged).

Global state. Policy lineage and policy versions are recorded on every shard
(`claim_lineage`, `record_versions`): a version is activated only when every
shard accepted it, so the cap in force is the same wherever a subject lives.
Central caps, reservations and the ledger identity signed into receipts live on
shard 0 (the first URL): central commands take ``--ledger`` of shard 0.

Statistics are per shard (each shard's rows per collector instance); `statistics`
returns every shard's partials, each named ``<shard index>/<instance>``, for the
aggregator's mergeable merge (aggregator/reports.py `merge_partials`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from fedldp.collector.ledger.schema import ledger_info, reports, spend
from fedldp.collector.ledger.store import (
    Access,
    LedgerError,
    LedgerPolicy,
    Mismatch,
    PartialStatistic,
    PolicyLineage,
    PolicyVersion,
    open_ledger,
)
from fedldp.collector.ledger.store import Ledger as SingleLedger

#: Slots of the shard map: the unit that moves when a shard is added (at most
#: `MAX_SHARDS` shards, one byte per slot in the stored map).
SLOTS = 4096
MAX_SHARDS = 64
MAP_KEY = "shard_map"
_MAP_FORMAT = 1
_CACHE_LIMIT = 100_000  # routed subjects remembered per collector (moved slots only)


class ShardMapError(LedgerError):
    """The shards' maps are missing, disagree, or do not match the URLs given."""


class SubjectSplitError(LedgerError):
    """A subject has spend rows on two shards: refused until an operator resolves it."""


def slot_of(subject: str) -> int:
    """The subject's slot: first 8 bytes of SHA-256(subject, UTF-8), big-endian, mod SLOTS."""
    digest = hashlib.sha256(subject.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % SLOTS


@dataclass(frozen=True)
class ShardMap:
    """Which shard owns each slot, per epoch; `ledger_ids[i]` is shard i's ledger id."""

    ledger_ids: tuple[str, ...]
    epochs: tuple[bytes, ...]  # each: one owner byte per slot

    @classmethod
    def initial(cls, ledger_ids: Sequence[str]) -> ShardMap:
        """Epoch 0: slot s belongs to shard s mod N."""
        count = len(ledger_ids)
        if not 1 <= count <= MAX_SHARDS:
            raise ShardMapError(f"between 1 and {MAX_SHARDS} shards, not {count}")
        if len(set(ledger_ids)) != count:
            raise ShardMapError("a database is listed twice among the shards")
        return cls(tuple(ledger_ids), (bytes(s % count for s in range(SLOTS)),))

    def add_shard(self, ledger_id: str) -> ShardMap:
        """A new epoch with shard N (`ledger_id`) added: of each old shard's slots,
        in slot order, every (N+1)-th from the N-th on (positions N, 2N+1, ...)
        moves to the new shard, about 1/(N+1) of all slots; no slot moves between
        old shards."""
        new = len(self.ledger_ids)
        if ledger_id in self.ledger_ids:
            raise ShardMapError(f"ledger {ledger_id} is a shard already")
        if new >= MAX_SHARDS:
            raise ShardMapError(f"at most {MAX_SHARDS} shards")
        owners = bytearray(self.epochs[-1])
        seen = [0] * new
        for slot, owner in enumerate(self.epochs[-1]):
            if seen[owner] % (new + 1) == new:
                owners[slot] = new
            seen[owner] += 1
        return ShardMap((*self.ledger_ids, ledger_id), (*self.epochs, bytes(owners)))

    def owners(self, slot: int) -> list[int]:
        """The slot's distinct owners in epoch order; the last is its current owner."""
        chain: list[int] = []
        for epoch in self.epochs:
            if not chain or chain[-1] != epoch[slot]:
                if epoch[slot] in chain:
                    chain.remove(epoch[slot])
                chain.append(epoch[slot])
        return chain

    def to_json(self) -> str:
        """The stored form (ledger_info value)."""
        return json.dumps(
            {
                "format": _MAP_FORMAT,
                "slots": SLOTS,
                "ledger_ids": list(self.ledger_ids),
                "epochs": [e.hex() for e in self.epochs],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ShardMap:
        """Parse the stored form; ShardMapError when it is not one this version reads."""
        try:
            doc = json.loads(text)
            if doc["format"] != _MAP_FORMAT or doc["slots"] != SLOTS:
                raise ShardMapError(f"unsupported shard map (format {doc['format']})")
            ids = tuple(str(i) for i in doc["ledger_ids"])
            epochs = tuple(bytes.fromhex(e) for e in doc["epochs"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ShardMapError(f"unreadable shard map: {exc}") from None
        if not epochs or any(len(e) != SLOTS or max(e) >= len(ids) for e in epochs):
            raise ShardMapError("shard map with a slot owned by no listed shard")
        return cls(ids, epochs)


def read_map(ledger: SingleLedger) -> ShardMap | None:
    """The shard map stored in `ledger` (None: not a shard of a sharded ledger)."""

    def tx(conn: sa.Connection) -> str | None:
        q = sa.select(ledger_info.c.value).where(ledger_info.c.key == MAP_KEY)
        value = conn.execute(q).scalar_one_or_none()
        return None if value is None else str(value)

    text = ledger.transaction(tx, write=False)
    return None if text is None else ShardMap.from_json(text)


def write_map(
    ledger: SingleLedger, new: ShardMap, old: ShardMap | None, *, require_empty: bool = False
) -> None:
    """Store `new` in `ledger` if it holds `old` (compare-and-set; None: no map yet);
    ShardMapError if it holds something else. With `require_empty`, a first map
    (`old` None) is stored only if the ledger holds no charges (`_charged`), checked
    in the same transaction as the insert."""
    new_text = new.to_json()

    def tx(conn: sa.Connection) -> None:
        q = sa.select(ledger_info.c.value).where(ledger_info.c.key == MAP_KEY).with_for_update()
        stored = conn.execute(q).scalar_one_or_none()
        if stored == new_text:
            return
        if stored is None and old is None:
            if require_empty and _charged(conn):
                raise _charged_error(ledger)
            conn.execute(sa.insert(ledger_info).values(key=MAP_KEY, value=new_text))
        elif stored is not None and old is not None and stored == old.to_json():
            conn.execute(
                sa.update(ledger_info).where(ledger_info.c.key == MAP_KEY).values(value=new_text)
            )
        else:
            raise ShardMapError(
                f"the shard map in {_shown(ledger.url)} changed meanwhile; run the command again"
            )

    ledger.transaction(tx)


def _shown(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


def _charged(conn: sa.Connection) -> bool:
    """Whether the ledger holds charges: a spend row with reports, or a report row."""
    charged = sa.select(spend.c.subject).where(spend.c.report_count > 0).limit(1)
    stored = sa.select(reports.c.report_id).limit(1)
    return conn.execute(charged).first() is not None or conn.execute(stored).first() is not None


def _charged_error(ledger: SingleLedger) -> ShardMapError:
    return ShardMapError(
        f"{_shown(ledger.url)} already holds charges and no shard map: grow a charged "
        "ledger with `fedldp ledger shards add` (it keeps every charged subject where it is), "
        "never by listing it in ledger_shards with other databases"
    )


def _position(ledger: SingleLedger) -> tuple[int | None, int] | None:
    """(`ledger`'s index in its shard map, None if unlisted; the number of shards),
    or None when it holds no map (a plain ledger)."""
    found = read_map(ledger)
    if found is None:
        return None
    own = ledger.ledger_id()
    index = found.ledger_ids.index(own) if own in found.ledger_ids else None
    return index, len(found.ledger_ids)


def refuse_if_shard(ledger: SingleLedger) -> None:
    """ShardMapError when `ledger` is one shard of a sharded ledger: a collector
    given only its URL would charge subjects that live on another shard, and a
    reader (report, reconcile, show) would see only part of the data. Read-only."""
    position = _position(ledger)
    if position is not None:
        index, count = position
        raise ShardMapError(
            f"{_shown(ledger.url)} is shard {'?' if index is None else index} of {count} of a "
            "sharded ledger: list every shard in ledger_shards, in order, instead of "
            "ledger_url (commands: --config FILE with ledger_shards, not --ledger)"
        )


def refuse_unless_central(ledger: SingleLedger) -> None:
    """ShardMapError when `ledger` is a shard other than shard 0 of a sharded ledger:
    central caps, reservations and the receipts' ledger identity live on shard 0
    only, so a second set on another shard would grant a central cap again.
    A plain ledger (no map) and shard 0 pass. Read-only."""
    position = _position(ledger)
    if position is not None and position[0] != 0:
        index, count = position
        raise ShardMapError(
            f"{_shown(ledger.url)} is shard {'?' if index is None else index} of {count} of a "
            "sharded ledger: central caps and reservations live on shard 0; pass the first "
            "URL of ledger_shards (or --config FILE with ledger_shards)"
        )


def open_checked(url: str, check: Callable[[SingleLedger], None], **options: Any) -> SingleLedger:
    """`open_ledger(url, **options)`, then `check` it (`refuse_if_shard`,
    `refuse_unless_central`); closed again when the check raises."""
    ledger = open_ledger(url, **options)
    try:
        check(ledger)
    except BaseException:
        ledger.close()
        raise
    return ledger


def open_central_ledger(url: str, **options: Any) -> SingleLedger:
    """The ledger holding central caps and reservations (`open_ledger` options):
    a plain ledger or shard 0 of a sharded one (`refuse_unless_central`). Every
    opener of central state (CLI central commands, release service, training)
    goes through here."""
    return open_checked(url, refuse_unless_central, **options)


class ShardedLedger:
    """N single ledgers (`shards`, in map order) and the shard map routing subjects."""

    def __init__(self, shards: Sequence[SingleLedger], shard_map: ShardMap) -> None:
        if len(shards) != len(shard_map.ledger_ids):
            raise ShardMapError("one ledger per shard of the map is required")
        self.shards = list(shards)
        self.map = shard_map
        first = self.shards[0]
        self.dialect = first.dialect
        self.shard = first.shard  # this collector instance's name (statistics rows)
        self._placed: dict[str, int] = {}  # subject -> shard index (moved slots only)
        self._placed_lock = threading.Lock()

    # -- routing --

    def route(self, subject: str) -> int:
        """The index of the shard that holds (or will hold) `subject`'s charges.

        For a slot that never moved: its owner, no database read. For a moved slot:
        read once per subject (then cached) which of its owners hold spend rows of
        the subject (module docstring). Raises SubjectSplitError when two do, and
        what the databases raise when one cannot be read.
        """
        chain = self.map.owners(slot_of(subject))
        if len(chain) == 1:
            return chain[0]
        placed = self._placed.get(subject)
        if placed is not None:
            return placed
        holders = [i for i in chain if self.shards[i].subject_spend(subject)]
        if len(holders) > 1:
            raise SubjectSplitError(
                f"a subject has charges on shards {holders}; nothing is charged until an "
                "operator resolves it (`fedldp ledger reconcile` lists it)"
            )
        index = holders[0] if holders else chain[-1]
        with self._placed_lock:
            if len(self._placed) >= _CACHE_LIMIT:
                self._placed.clear()
            self._placed[subject] = index
        return index

    def for_subject(self, subject: str) -> SingleLedger:
        """The single ledger holding `subject`'s charges (`route`)."""
        return self.shards[self.route(subject)]

    # -- policy lineage and versions: on every shard --

    def claim_lineage(
        self, policy_id: str, metric_name: str, window_seconds: int, version: int, *, now: int
    ) -> PolicyLineage:
        """`Ledger.claim_lineage` on each shard in order, stopping at the first lineage
        that refuses the version (`PolicyLineage.refusal`), which is returned; else
        shard 0's. Every collector claims in the same order, so shard 0 arbitrates
        concurrent claims and only its winner records on the other shards: a version
        is activated only where every shard's lineage lets it in."""
        first: PolicyLineage | None = None
        for s in self.shards:
            lineage = s.claim_lineage(policy_id, metric_name, window_seconds, version, now=now)
            if lineage.refusal(policy_id, metric_name, window_seconds) is not None:
                return lineage
            first = first or lineage
        assert first is not None  # there is at least one shard
        return first

    def record_versions(
        self, versions: Sequence[PolicyVersion], *, clock: Callable[[], int]
    ) -> dict[tuple[str, int], str]:
        """`Ledger.record_versions` on each shard in order, each given only the
        versions every earlier shard accepted; the refused ones (with the first
        reason). As for lineage, shard 0 arbitrates (e.g. two envelopes of one
        version). Each shard decides its cap rule at its own `clock()` under its own
        lock: the cap rule is per subject, and a subject lives on one shard. A version
        recorded on some shards but refused by a later one is not served, and only
        lowers caps where it is recorded (never unsafe)."""
        refused: dict[tuple[str, int], str] = {}
        left = list(versions)
        for index, s in enumerate(self.shards):
            if not left:
                break
            for key, why in s.record_versions(left, clock=clock).items():
                refused[key] = f"{why} (shard {index})" if index else why
            left = [v for v in left if (v.policy_id, v.version) not in refused]
        return refused

    # -- statistics (aggregator/reports.py StatisticsSource) --

    def statistics(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> list[PartialStatistic]:
        """Every shard's partial statistics, each named ``<shard index>/<instance>``."""
        return [
            dataclasses.replace(p, shard=f"{i}/{p.shard}")
            for i, s in enumerate(self.shards)
            for p in s.statistics(policy_id, version, window_start)
        ]

    def recompute_statistics(self, policy: LedgerPolicy, window_start: int | None = None) -> Any:
        """The statistic recomputed from every shard's raw report rows, merged."""
        mech = policy.mechanism
        total = mech.new_statistic()
        for s in self.shards:
            mech.merge_statistics(total, s.recompute_statistics(policy, window_start))
        return total

    # -- reconcile --

    def reconcile_shards(self) -> list[tuple[int, list[Mismatch]]]:
        """Each shard's own `Ledger.reconcile`, then the placement checks (shard
        index -1): every subject with spend rows on a shard that never owned its
        slot ("misplaced"), on two shards ("split"), and lineages that differ
        between shards ("lineage")."""
        out = [(i, s.reconcile()) for i, s in enumerate(self.shards)]
        out.append((-1, self._placement()))
        return out

    def _placement(self) -> list[Mismatch]:
        found: list[Mismatch] = []
        homes: dict[str, int] = {}
        for index, s in enumerate(self.shards):
            for subject in _subjects(s):
                if index not in self.map.owners(slot_of(subject)):
                    found.append(
                        Mismatch(
                            "misplaced",
                            subject,
                            f"shard {index}",
                            f"owners {self.map.owners(slot_of(subject))}",
                            f"shard {index}",
                        )
                    )
                other = homes.setdefault(subject, index)
                if other != index:
                    found.append(
                        Mismatch(
                            "split",
                            subject,
                            "spend rows",
                            f"shard {other} only",
                            f"shards {other} and {index}",
                        )
                    )
        first = self.shards[0].lineages()
        for index, s in enumerate(self.shards[1:], start=1):
            theirs = s.lineages()
            if theirs != first:
                found.append(
                    Mismatch(
                        "lineage",
                        None,
                        f"shard {index}",
                        f"{len(first)} lineages as shard 0",
                        f"{len(theirs)} lineages, differing",
                    )
                )
        return found

    def close(self) -> None:
        """Close every shard."""
        for s in self.shards:
            s.close()

    def __enter__(self) -> ShardedLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _subjects(ledger: SingleLedger) -> Iterator[str]:
    """Every subject with spend rows in `ledger` (one snapshot)."""

    def tx(conn: sa.Connection) -> list[str]:
        q = sa.select(spend.c.subject).where(spend.c.report_count > 0).distinct()
        return [str(r[0]) for r in conn.execute(q)]

    yield from ledger.transaction(tx, write=False)


def _open_all(urls: Sequence[str], open_one: Callable[[str], SingleLedger]) -> list[SingleLedger]:
    opened: list[SingleLedger] = []
    try:
        for url in urls:
            opened.append(open_one(url))
    except BaseException:
        for led in opened:
            led.close()
        raise
    return opened


def _agreed(
    ledgers: Sequence[SingleLedger], maps: Sequence[ShardMap | None], ids: Sequence[str]
) -> ShardMap | None:
    """The one map the shards hold (None: none holds one); ShardMapError when they
    disagree or it does not list exactly these ledgers in this order."""
    stored = {m for m in maps if m is not None}
    if not stored:
        return None
    if len(stored) > 1:
        raise ShardMapError(
            "the shards hold different shard maps (an interrupted `fedldp ledger shards add`?): "
            "run it again to finish"
        )
    found = stored.pop()
    if tuple(ids) != found.ledger_ids:
        if len(found.ledger_ids) != len(ids):
            raise ShardMapError(
                f"{len(ids)} shard URL(s) given, but the ledger's shard map has "
                f"{len(found.ledger_ids)} shards: list every shard, in order"
            )
        wrong = next(
            i for i, (a, b) in enumerate(zip(ids, found.ledger_ids, strict=True)) if a != b
        )
        raise ShardMapError(
            f"shard {wrong} ({_shown(ledgers[wrong].url)}) is not the database the shard map "
            "lists there: list the shards in the map's order"
        )
    return found


def open_sharded(
    urls: Sequence[str],
    *,
    access: Access = "create",
    shard: str | None = None,
    isolation: str | None = None,
    pool_size: int = 8,
) -> ShardedLedger:
    """Open the shards at `urls` (shard 0 first) and check their shard map.

    Shards holding no map yet get epoch 0 (`ShardMap.initial`) unless `access` is
    "read"; a first start over several databases is refused when one already holds
    charges (`_refuse_charged`: grow a charged ledger with `add_shard`); maps that
    disagree, or that list other databases or another order than `urls`, raise
    ShardMapError. `shard` names this collector instance in the
    statistics tables (as `open_ledger`).
    """
    if not urls:
        raise ShardMapError("at least one shard URL is required")
    ledgers = _open_all(
        urls,
        lambda url: open_ledger(
            url, shard=shard, isolation=isolation, pool_size=pool_size, access=access
        ),
    )
    try:
        ids = [led.ledger_id() for led in ledgers]
        maps = [read_map(led) for led in ledgers]
        found = _agreed(ledgers, maps, ids)
        if found is None:
            found = ShardMap.initial(ids)
            if access != "read":
                _refuse_charged(ledgers)
                for led in ledgers:
                    write_map(led, found, None, require_empty=len(ledgers) > 1)
        elif None in maps and access != "read" and found == ShardMap.initial(ids):
            for led, stored in zip(ledgers, maps, strict=True):  # a concurrent first start
                if stored is None:
                    write_map(led, found, None, require_empty=True)
        elif None in maps:
            raise ShardMapError(
                "some shards hold no shard map: a shard was added without "
                "`fedldp ledger shards add`, or it did not finish (run it again)"
            )
        return ShardedLedger(ledgers, found)
    except BaseException:
        for led in ledgers:
            led.close()
        raise


def _refuse_charged(ledgers: Sequence[SingleLedger]) -> None:
    """A first start over several databases: ShardMapError, before any map is
    written, when one already holds charges (epoch 0 would re-route its subjects
    whose slot is not its own: a second cap). One database alone moves nothing.
    `write_map(require_empty=True)` repeats the check in the insert's transaction,
    so a charge that lands meanwhile still refuses that shard's map."""
    if len(ledgers) < 2:
        return
    for led in ledgers:
        if led.transaction(_charged, write=False):
            raise _charged_error(led)


def add_shard(urls: Sequence[str], new_url: str, *, now: int) -> ShardMap:
    """Add the empty ledger at `new_url` as shard N of the shards at `urls`; the new map.

    Run with every collector stopped (collectors read the map when they start).
    Creates/migrates the new database, copies every shard's policy lineages and
    versions to it, then stores the new map (`ShardMap.add_shard`) on the new
    shard and then on each old one. Safe to run again after an interruption: it
    finishes what is missing. Refuses a new database that already holds reports.
    """
    old_ledgers = _open_all(urls, lambda url: open_ledger(url, access="write"))
    try:
        new = open_ledger(new_url, access="create")
        try:
            return _add(old_ledgers, new, now=now)
        finally:
            new.close()
    finally:
        for led in old_ledgers:
            led.close()


def _add(old: Sequence[SingleLedger], new: SingleLedger, *, now: int) -> ShardMap:
    ids = [led.ledger_id() for led in old]
    new_id = new.ledger_id()
    maps = [read_map(led) for led in old]
    finished = [m for m in maps if m is not None and m.ledger_ids[-1:] == (new_id,)]
    before = [m for m in maps if m not in finished]
    base = _agreed(old, before, ids) if before else None
    if base is None and not finished and any(m is not None for m in maps):
        raise ShardMapError("the shards' maps disagree")
    base = base or ShardMap.initial(ids)
    target = base.add_shard(new_id)
    if any(m != target for m in finished):
        raise ShardMapError("a shard holds a map that is neither the old nor the new one")
    new_map = read_map(new)
    if new_map is None and _subjects_any(new):
        raise ShardMapError(f"{_shown(new.url)} already holds charges: add an empty database")
    if new_map not in (None, target):
        raise ShardMapError(f"{_shown(new.url)} is a shard of another map")
    for lineage in old[0].lineages():
        new.claim_lineage(
            lineage.policy_id,
            lineage.metric_name,
            lineage.window_seconds,
            lineage.first_version,
            now=lineage.recorded_at,
        )
    versions = {(v.policy_id, v.version): v for led in old for v in led.policy_versions()}
    refused = new.record_versions(list(versions.values()), clock=lambda: now)
    if refused:
        raise ShardMapError(f"the new shard refused policy versions: {sorted(refused)}")
    write_map(new, target, new_map)
    for led, stored in zip(old, maps, strict=True):
        if stored != target:
            write_map(led, target, stored)
    return target


def _subjects_any(ledger: SingleLedger) -> bool:
    return next(_subjects(ledger), None) is not None
