"""The training jobs' durable store: one folder per job under the operator's jobs folder.

Layout (inside the trusted boundary, mode 0700)::

    JOBS/.lock              held (flock) by the one service using the folder
    JOBS/<job id>/job.json  the record (JobRecord), replaced atomically on each change
    JOBS/<job id>/out/      model.pt and receipt.json, written by the training engine

A job id is the first 32 hex digits of SHA-256 of the job's ledger idempotency key
(`train_ledger_key`: scoped to the analyst), so a second submission with the same
key finds the first one's record (submissions are serialized by a lock, and the
folder's flock keeps every other process out). A
record is written before anything it describes happens elsewhere: the owner token
before the ledger reservation, so a restarted service can always find and close
what a killed one left open (training.py, `recover`).

A record holds no data: ids, states, the request's bytes (what the analyst sent),
amounts and digests.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

QUEUED, RUNNING, SUCCEEDED, FAILED = "queued", "running", "succeeded", "failed"
TERMINAL = (SUCCEEDED, FAILED)


class JobsFolderBusyError(RuntimeError):
    """Another service process holds the jobs folder."""


def train_ledger_key(analyst: str, key: str) -> str:
    """The ledger idempotency key of an analyst's training key.

    Length-prefixed like the releases' keys (engine.ledger_key), in a namespace
    of its own, so a training key never collides with a release key or another
    analyst's key.
    """
    return f"release-service-train:{len(analyst)}:{analyst}:{key}"


def job_id_of(ledger_key: str) -> str:
    """The job id of a ledger key (module docstring)."""
    return hashlib.sha256(ledger_key.encode("utf-8")).hexdigest()[:32]


@dataclass
class JobRecord:
    """Everything a service needs to report, run or recover one job."""

    job_id: str
    analyst: str
    ledger_key: str
    request_b64: str
    request_sha256: str
    state: str
    submitted_at: int
    dataset: str
    purpose: str
    model: str
    finished_at: int = 0
    owner: str = ""
    reservation_id: str = ""
    charged: bool = False
    error_code: str = ""
    error_message: str = ""
    error_class: str = ""
    epsilon_spent: str = ""
    delta_spent: str = ""
    steps: int = 0
    stop_reason: str = ""
    model_sha256: str = ""
    model_size: int = 0

    @property
    def request_bytes(self) -> bytes:
        """The stored SubmitTrainingRequest's deterministic serialization (decoded from
        `request_b64`); binascii.Error when the record's field was tampered with."""
        return base64.b64decode(self.request_b64)


class JobStore:
    """The records on disk and in memory; `changed` is notified on every save."""

    def __init__(self, root: Path) -> None:
        """Create `root` (0700) if needed and take its lock (JobsFolderBusyError if held)."""
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root = root
        self._lock_file: IO[bytes] | None = (root / ".lock").open("ab")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            self._lock_file = None
            raise JobsFolderBusyError(
                f"the jobs folder {root} is in use by another release service process"
            ) from None
        self.changed = threading.Condition()
        self._records: dict[str, JobRecord] = {}
        for path in sorted(root.glob("*/job.json")):
            record = JobRecord(**json.loads(path.read_text(encoding="utf-8")))
            self._records[record.job_id] = record

    def close(self) -> None:
        """Release the folder's lock."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def folder(self, job_id: str) -> Path:
        """The job's own folder under `root` (a path only: nothing is created or checked)."""
        return self.root / job_id

    def output(self, job_id: str) -> Path:
        """Where the training engine writes model.pt and receipt.json."""
        return self.folder(job_id) / "out"

    def get(self, job_id: str) -> JobRecord | None:
        """A copy of the record (None when there is none)."""
        with self.changed:
            record = self._records.get(job_id)
            return None if record is None else dataclasses.replace(record)

    def records(self) -> Iterator[JobRecord]:
        """Copies of every record, oldest submission first."""
        with self.changed:
            ordered = sorted(self._records.values(), key=lambda r: (r.submitted_at, r.job_id))
            copies = [dataclasses.replace(r) for r in ordered]
        yield from copies

    def create(self, record: JobRecord) -> None:
        """Store a new job. The caller holds the submissions' lock and found no record
        for its id (a folder without a record — a crash between the two — is reused)."""
        self.folder(record.job_id).mkdir(mode=0o700, exist_ok=True)
        self.save(record)

    def save(self, record: JobRecord) -> None:
        """Write the record durably (temporary file, fsync, rename), then notify waiters."""
        path = self.folder(record.job_id) / "job.json"
        tmp = path.with_suffix(".json.tmp")
        data = json.dumps(dataclasses.asdict(record), sort_keys=True).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        with self.changed:
            self._records[record.job_id] = dataclasses.replace(record)
            self.changed.notify_all()

    def update(self, job_id: str, **changes: Any) -> JobRecord:
        """Apply `changes` to the stored record and save it; the new record."""
        with self.changed:
            record = dataclasses.replace(self._records[job_id], **changes)
        self.save(record)
        return record

    def wait_finished(self, job_id: str, seconds: float) -> None:
        """Block until the job is terminal or `seconds` pass."""
        with self.changed:
            self.changed.wait_for(lambda: self._records[job_id].state in TERMINAL, timeout=seconds)

    def count(self, state: str) -> int:
        """How many stored records are in `state` right now (0 for an unknown state)."""
        with self.changed:
            return sum(1 for r in self._records.values() if r.state == state)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem syncs a folder
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
