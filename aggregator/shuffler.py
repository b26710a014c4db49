"""The shuffler role: a window's sealed payloads out in a uniformly random order, once.

Trust split (docs/shuffle.md): the collector authenticates devices, charges the ledger and
appends only (batch key, ciphertext) to a spool (`ShuffleSpool.add`); it cannot read a payload
(each is sealed to the analyzer's key: fedldp.client.sealed). The shuffler (`release`) takes one
batch's ciphertexts, refuses to release fewer than `min_batch`, orders them by a uniform random
permutation drawn from the OS CSPRNG (`random.SystemRandom().shuffle`, Fisher-Yates), and writes
the shuffled batch file for the analyzer: ciphertexts only, no subject, time or arrival order
(the spool keeps no subject at all; its row order is discarded by the permutation).

Durability and idempotency across a kill -9 at any instant: the batch file is written to a
temporary name, fsynced, renamed into place (atomic) and its folder fsynced; only then does one
SQLite transaction record the release and delete the batch's spool rows. A restart finds one of:
nothing written (the temporary file is discarded and the batch permuted afresh: nothing was
released), or the renamed file without its record (the record is completed; the file, already
the release, is not rewritten), or both (nothing to do). So no ciphertext is lost and no batch is
released twice. The release first claims the batch (one transaction, after the size check), so
`add` refuses ciphertexts for a batch being or already released: the rows a restart reads are
the rows the killed run read. Releases from one spool are serialized by an exclusive flock on
SPOOL.lock (released by the kernel when its holder dies), so two shuffler processes never both
permute and write one batch.

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from fedldp.client.sealed import MAX_CIPHERTEXT_BYTES

MAGIC = b"fedldp-shuffled-batch v1\n"
_LENGTH = struct.Struct(">I")
_KEY = re.compile(r"[A-Za-z0-9._:=-]{1,200}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (batch TEXT NOT NULL, ciphertext BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS inbox_batch ON inbox (batch);
CREATE TABLE IF NOT EXISTS claimed (batch TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS released (
    batch TEXT PRIMARY KEY, count INTEGER NOT NULL, sha256 TEXT NOT NULL
);
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

    def add(self, batch: str, ciphertexts: Iterable[bytes]) -> int:
        """Append ciphertexts to `batch` in one transaction; how many were added.

        Raises BatchReleasedError when the batch was released already, ValueError for an
        empty or oversized ciphertext (then nothing is added).
        """
        _check_key(batch)
        rows = [(batch, bytes(c)) for c in ciphertexts]
        if any(not 0 < len(c) <= MAX_CIPHERTEXT_BYTES for _, c in rows):
            raise ValueError(f"a ciphertext must be 1 to {MAX_CIPHERTEXT_BYTES} bytes")
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM claimed WHERE batch = ?", (batch,)).fetchone():
                    raise BatchReleasedError(f"batch {batch} is being or was released")
                db.executemany("INSERT INTO inbox (batch, ciphertext) VALUES (?, ?)", rows)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return len(rows)

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


def _write_batch(path: Path, batch: str, ciphertexts: list[bytes]) -> str:
    """Write the batch file durably (temporary name, fsync, rename, fsync folder); its SHA-256."""
    tmp = path.with_name(path.name + ".tmp")
    digest = hashlib.sha256()
    with open(tmp, "wb") as f:
        for chunk in _encode(batch, ciphertexts):
            digest.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return digest.hexdigest()


def _encode(batch: str, ciphertexts: list[bytes]) -> Iterator[bytes]:
    """The batch file's bytes, in pieces."""
    yield MAGIC
    yield json.dumps({"batch": batch, "count": len(ciphertexts)}).encode() + b"\n"
    for c in ciphertexts:
        yield _LENGTH.pack(len(c)) + c


def read_batch(path: Path) -> tuple[str, list[bytes]]:
    """(batch key, ciphertexts in shuffled order) from a batch file; ValueError if malformed."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError("not a fedldp shuffled batch")
    end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC) : end])
    pos, out = end + 1, []
    while pos < len(data):
        (length,) = _LENGTH.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    if pos != len(data) or len(out) != header["count"]:
        raise ValueError("shuffled batch is truncated or its count is wrong")
    return str(header["batch"]), out


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
    """`release`'s body, under the spool's lock (so two shufflers never both write a batch)."""
    path = batch_path(out_dir, batch)
    stage = on_stage or (lambda _name: None)
    if spool.released(batch) is not None:
        return path
    if path.exists():  # renamed into place, then killed before the record: finish the record
        _, ciphertexts = read_batch(path)
        spool._record(batch, len(ciphertexts), hashlib.sha256(path.read_bytes()).hexdigest())
        stage("recorded")
        return path
    ciphertexts = spool._claim(batch, min_batch)
    permute(ciphertexts, rng)
    stage("permuted")
    sha256 = _write_batch(path, batch, ciphertexts)
    stage("written")
    spool._record(batch, len(ciphertexts), sha256)
    stage("recorded")
    return path
