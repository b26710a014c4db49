"""The shuffler role: a window's sealed payloads out in a uniformly random order, once.

Trust split (docs/shuffle.md): the collector authenticates devices, charges the ledger and
stores each sealed payload (it cannot read one: each is sealed to the analyzer's key,
fedldp.client.sealed); `pull_window` copies a window's ciphertexts alone, from the ledger
read-only, into the spool as (batch key, ciphertext) rows (`ShuffleSpool.add_once`). The
shuffler (`release`) takes one batch's ciphertexts, refuses to release fewer than
`min_batch`, orders them by a uniform random permutation drawn from the OS CSPRNG
(`random.SystemRandom().shuffle`, Fisher-Yates), and writes the shuffled batch file for the
analyzer: ciphertexts only, no subject, time or arrival order (the spool keeps no subject at
all; its row order is discarded by the permutation).

Durability and idempotency across a kill -9 at any instant: the batch file is written to a
temporary name, fsynced, renamed into place (atomic) and its folder fsynced; only then does one
SQLite transaction record the release and delete the batch's spool rows. Before the write, the
spool records the file's path and SHA-256 (its "intent"). A restart, into any folder, finds one of:
nothing renamed (the temporary file is discarded and the batch permuted afresh: nothing was
released), or the intended file, byte for byte, without its record (the record is completed; the
file, already the release, is not rewritten, and no second file is written elsewhere), or both
(nothing to do). A file of the batch's name that is not the intent (a leftover, another spool's
release) is never taken for the release: it is moved aside to NAME.foreign-SHA8. So no ciphertext
is lost and no batch is released twice. The release first claims the batch (one transaction, after
the size check), so `add` refuses ciphertexts for a batch being or already released: the rows a
restart reads are the rows the killed run read. Releases from one spool are serialized by an
exclusive flock on SPOOL.lock (released by the kernel when its holder dies), so two shuffler
processes never both permute and write one batch.

Batch file format: the line b"fedldp-shuffled-batch v1\\n", a JSON header line
{"batch": key, "count": n}, then n records of a 4-byte big-endian length and the ciphertext.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedldp.client.sealed import MAX_CIPHERTEXT_BYTES

MAGIC = b"fedldp-shuffled-batch v1\n"
_LENGTH = struct.Struct(">I")
_KEY = re.compile(r"[A-Za-z0-9._:=-]{1,200}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (batch TEXT NOT NULL, ciphertext BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS inbox_batch ON inbox (batch);
CREATE TABLE IF NOT EXISTS claimed (batch TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS pulled (
    batch TEXT NOT NULL, sha256 BLOB NOT NULL, PRIMARY KEY (batch, sha256)
);
CREATE TABLE IF NOT EXISTS intent (
    batch TEXT PRIMARY KEY, path TEXT NOT NULL, sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS released (
    batch TEXT PRIMARY KEY, count INTEGER NOT NULL, sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger_count (batch TEXT PRIMARY KEY, stored INTEGER NOT NULL);
"""


class BatchTooSmallError(ValueError):
    """A batch holds fewer ciphertexts than the minimum: nothing released, nothing changed."""


class BatchReleasedError(ValueError):
    """The batch was released already: a late ciphertext for it is refused."""


def _check_key(batch: str) -> None:
    """A batch key is 1-200 characters of [A-Za-z0-9._:=-] (it names a file)."""
    if not _KEY.fullmatch(batch):
        raise ValueError("batch key must be 1-200 characters of A-Z a-z 0-9 . _ : = -")


class ShuffleSpool:
    """The SQLite file between collector and shuffler: (batch, ciphertext) rows, releases."""

    def __init__(self, path: Path) -> None:
        """Open (creating if absent) the spool at `path`."""
        self.path = Path(path)
        with closing(self._connect()) as db, db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        """A connection with full durability (WAL, synchronous=FULL)."""
        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def add(
        self, batch: str, ciphertexts: Iterable[bytes], *, ledger_count: int | None = None
    ) -> int:
        """Append ciphertexts to `batch` in one transaction; how many were added.

        A ciphertext already in `batch` (or repeated within the call) is skipped: honest
        HPKE output never repeats, so a repeat is a replay and counts once (its SHA-256 is
        remembered in the same transaction). Raises BatchReleasedError when the batch was
        claimed or released, ValueError for an empty or oversized ciphertext (then nothing
        is added). `ledger_count`, when given, is how many sealed reports the collector's
        ledger held for the batch at this pull; it is recorded in the same transaction
        (`ledger_count`), so the count a release's manifest states is that of the last pull
        before the claim.
        """
        _check_key(batch)
        items = [bytes(c) for c in ciphertexts]
        if any(not 0 < len(c) <= MAX_CIPHERTEXT_BYTES for c in items):
            raise ValueError(f"a ciphertext must be 1 to {MAX_CIPHERTEXT_BYTES} bytes")
        added = 0
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM claimed WHERE batch = ?", (batch,)).fetchone():
                    raise BatchReleasedError(f"batch {batch} is being or was released")
                for c in items:
                    digest = hashlib.sha256(c).digest()
                    cur = db.execute(
                        "INSERT OR IGNORE INTO pulled (batch, sha256) VALUES (?, ?)",
                        (batch, digest),
                    )
                    if cur.rowcount == 1:
                        db.execute(
                            "INSERT INTO inbox (batch, ciphertext) VALUES (?, ?)", (batch, c)
                        )
                        added += 1
                if ledger_count is not None:
                    db.execute(
                        "INSERT OR REPLACE INTO ledger_count (batch, stored) VALUES (?, ?)",
                        (batch, ledger_count),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return added

    def add_once(
        self, batch: str, ciphertexts: Iterable[bytes], *, ledger_count: int | None = None
    ) -> int:
        """`add` (which skips a ciphertext already added to `batch`): pulling a window from
        the collector's ledger twice adds nothing twice. How many were added.

        Raises BatchReleasedError when the batch was claimed or released (nothing added).
        """
        return self.add(batch, ciphertexts, ledger_count=ledger_count)

    def ledger_count(self, batch: str) -> int | None:
        """The collector ledger's count of sealed reports for `batch` at its last pull
        before the claim (None: never pulled from a ledger)."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT stored FROM ledger_count WHERE batch = ?", (batch,)).fetchone()
        return None if row is None else int(row[0])

    def unreleased(self) -> list[str]:
        """Batch keys that took ciphertexts and are not released yet, sorted."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT DISTINCT batch FROM pulled WHERE batch NOT IN (SELECT batch FROM released)"
                " ORDER BY batch"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def pending(self, batch: str) -> int:
        """Ciphertexts waiting in `batch`."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT COUNT(*) FROM inbox WHERE batch = ?", (batch,)).fetchone()
        return int(row[0])

    def released(self, batch: str) -> tuple[int, str] | None:
        """(count, sha256 of the batch file) once `batch` is released, else None."""
        with closing(self._connect()) as db:
            row = db.execute(
                "SELECT count, sha256 FROM released WHERE batch = ?", (batch,)
            ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def _claim(self, batch: str, min_batch: int) -> list[bytes]:
        """Close `batch` to further `add`s and return its ciphertexts (spool order).

        One transaction: when fewer than `min_batch` wait, BatchTooSmallError and nothing
        changes. Claiming again (a restart) returns the same rows: none can be added since.
        """
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                rows = db.execute(
                    "SELECT ciphertext FROM inbox WHERE batch = ?", (batch,)
                ).fetchall()
                if len(rows) < min_batch:
                    raise BatchTooSmallError(
                        f"batch {batch} holds {len(rows)} ciphertexts, fewer than the minimum "
                        f"{min_batch}: not released"
                    )
                db.execute("INSERT OR IGNORE INTO claimed (batch) VALUES (?)", (batch,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return [bytes(r[0]) for r in rows]

    def _intent(self, batch: str) -> tuple[Path, str] | None:
        """(file, sha256) this spool was about to rename into place for `batch`, or None."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT path, sha256 FROM intent WHERE batch = ?", (batch,)).fetchone()
        return None if row is None else (Path(row[0]), str(row[1]))

    def _set_intent(self, batch: str, path: Path, sha256: str) -> None:
        """Remember, durably and before the rename, which file with which SHA-256 will be
        `batch`'s release: a restart then takes only that file for it."""
        with closing(self._connect()) as db:
            db.execute(
                "INSERT OR REPLACE INTO intent (batch, path, sha256) VALUES (?, ?, ?)",
                (batch, str(path.resolve()), sha256),
            )

    def _record(self, batch: str, count: int, sha256: str) -> None:
        """Record the release and drop the batch's spool rows, in one transaction."""
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT OR IGNORE INTO released (batch, count, sha256) VALUES (?, ?, ?)",
                (batch, count, sha256),
            )
            db.execute("DELETE FROM inbox WHERE batch = ?", (batch,))
            db.execute("COMMIT")


def batch_path(out_dir: Path, batch: str) -> Path:
    """Where `release` puts `batch`'s shuffled file."""
    _check_key(batch)
    return Path(out_dir) / f"{batch}.shuffled"


def _fsync_dir(folder: Path) -> None:
    """fsync a folder so a rename in it survives a crash."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_batch(path: Path, batch: str, ciphertexts: list[bytes]) -> None:
    """Write the batch file durably (temporary name, fsync, rename, fsync folder)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        for chunk in _encode(batch, ciphertexts):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _digest(batch: str, ciphertexts: list[bytes]) -> str:
    """SHA-256 (hex) of the batch file `_write_batch` writes for these ciphertexts."""
    digest = hashlib.sha256()
    for chunk in _encode(batch, ciphertexts):
        digest.update(chunk)
    return digest.hexdigest()


def _file_digest(path: Path) -> str | None:
    """SHA-256 (hex) of the file at `path`, or None when there is none."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _encode(batch: str, ciphertexts: list[bytes]) -> Iterator[bytes]:
    """The batch file's bytes, in pieces."""
    yield MAGIC
    yield json.dumps({"batch": batch, "count": len(ciphertexts)}).encode() + b"\n"
    for c in ciphertexts:
        yield _LENGTH.pack(len(c)) + c


def read_batch(path: Path) -> tuple[str, list[bytes]]:
    """(batch key, ciphertexts in shuffled order) from a batch file.

    Raises ValueError (and nothing else, for any content) when the file is malformed: no
    magic line, a header that is not a JSON object with a string "batch" and an integer
    "count", a record cut short, trailing bytes, or a count that does not match.
    """
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError("not a fedldp shuffled batch")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise ValueError("shuffled batch has no header line")
    try:
        header = json.loads(data[len(MAGIC) : end])
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError("shuffled batch header is not JSON") from exc
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("batch"), str)
        or type(header.get("count")) is not int
    ):
        raise ValueError('shuffled batch header must be {"batch": str, "count": int}')
    pos, out = end + 1, []
    while pos < len(data):
        if pos + _LENGTH.size > len(data):
            raise ValueError("shuffled batch is truncated inside a length prefix")
        (length,) = _LENGTH.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    if pos != len(data) or len(out) != header["count"]:
        raise ValueError("shuffled batch is truncated or its count is wrong")
    return header["batch"], out


def permute(items: list[bytes], rng: random.Random | None = None) -> None:
    """Reorder `items` in place by a uniform random permutation (Fisher-Yates).

    `rng` defaults to the OS CSPRNG (`random.SystemRandom`); a seeded one is for tests only.
    """
    (rng or random.SystemRandom()).shuffle(items)


@contextmanager
def _exclusive(spool: ShuffleSpool) -> Iterator[None]:
    """Hold an exclusive lock (flock on SPOOL.lock): one release at a time per spool."""
    with open(spool.path.with_name(spool.path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def release(
    spool: ShuffleSpool,
    batch: str,
    out_dir: Path,
    *,
    min_batch: int,
    rng: random.Random | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Path:
    """Release `batch` shuffled into `out_dir` (once; see the module docstring); its file.

    Raises BatchTooSmallError (nothing changed) when fewer than `min_batch` ciphertexts wait.
    `rng` defaults to the OS CSPRNG; a seeded one is for tests only. `on_stage(name)` is called
    after "permuted", "written" (file renamed into place) and "recorded": crash tests stop the
    process there.
    """
    if min_batch < 1:
        raise ValueError("min_batch must be at least 1")
    with _exclusive(spool):
        return _release_locked(spool, batch, Path(out_dir), min_batch, rng, on_stage)


def _release_locked(
    spool: ShuffleSpool,
    batch: str,
    out_dir: Path,
    min_batch: int,
    rng: random.Random | None,
    on_stage: Callable[[str], None] | None,
) -> Path:
    """`release`'s body, under the spool's lock (so two shufflers never both write a batch).

    A batch file is this spool's release only if its path and SHA-256 are the intent this
    spool recorded before the rename: a restart (into any --out) finishes that release and
    returns its file; a file of the same name it did not write (another spool's, a leftover)
    is moved aside to NAME.foreign-SHA8, never taken for the release.
    """
    path = batch_path(out_dir, batch)
    stage = on_stage or (lambda _name: None)
    intent = spool._intent(batch)
    if spool.released(batch) is not None:
        return path if intent is None else intent[0]
    if intent is not None and _file_digest(intent[0]) == intent[1]:
        # renamed into place, then killed before the record: finish the record
        _, done = read_batch(intent[0])
        spool._record(batch, len(done), intent[1])
        stage("recorded")
        return intent[0]
    foreign = _file_digest(path)
    if foreign is not None:
        os.replace(path, path.with_name(f"{path.name}.foreign-{foreign[:8]}"))
    ciphertexts = spool._claim(batch, min_batch)
    permute(ciphertexts, rng)
    stage("permuted")
    sha256 = _digest(batch, ciphertexts)
    spool._set_intent(batch, path, sha256)
    _write_batch(path, batch, ciphertexts)
    stage("written")
    spool._record(batch, len(ciphertexts), sha256)
    stage("recorded")
    return path


def window_batch(policy_id: str, version: int, window_start: int) -> str:
    """The batch key of one policy version's window: ``<policy id>.v<version>.<window start>``.

    One batch is one policy window, so the ledger's per-window cap bounds how many reports
    of one device a batch holds (docs/shuffle.md, "Who must not collude with whom").
    """
    key = f"{policy_id}.v{version}.{window_start}"
    _check_key(key)
    return key


@dataclass(frozen=True)
class Pulled:
    """What `pull_window` did for one policy version's batch."""

    batch: str
    added: int  # ciphertexts new to the spool now
    stored: int  # sealed reports the ledger holds for it
    released: bool  # the batch was claimed or released already: nothing added


def pull_window(
    by_version: Mapping[int, list[bytes]], spool: ShuffleSpool, policy_id: str, window_start: int
) -> list[Pulled]:
    """Add a window's ciphertexts (`Ledger.sealed_ciphertexts`: policy version -> sorted
    ciphertexts, nothing else) to `spool`, one batch per version (`window_batch`).

    Idempotent (`ShuffleSpool.add_once`): pulling again adds only ciphertexts stored since;
    a batch released already takes nothing (`released` is then True).
    """
    out: list[Pulled] = []
    for version, ciphertexts in sorted(by_version.items()):
        batch = window_batch(policy_id, version, window_start)
        try:
            added = spool.add_once(batch, ciphertexts, ledger_count=len(ciphertexts))
        except BatchReleasedError:
            out.append(Pulled(batch, 0, len(ciphertexts), True))
            continue
        out.append(Pulled(batch, added, len(ciphertexts), False))
    return out
