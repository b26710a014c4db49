"""Report ids: unique, unpredictable, and cheap for the collector to index.

A report id is the collector's idempotency key (DESIGN.md, Ledger): 16 bytes,
unique over the whole fleet, the same on every retry of a report. The collector
keeps a unique index on it, so the order in which ids arrive decides what that
index costs: fully random ids send every insert to a random leaf of a large
B-tree (each one dirties and logs a page), while ids that arrive close together
in key order share leaves. A device's reports travel together, in order, in one
batch (`DeviceClient.flush` sends up to `batch_size` per request), so the SDK
makes each device's consecutive ids adjacent:

    report_id = run prefix (8 bytes) || run start (8 bytes) + i   (big-endian, mod 2^64)

A *run* is up to `RUN_LENGTH` consecutive ids of one `ReportIds`; its prefix and
its start are drawn fresh from the OS CSPRNG (`secrets`) when the run begins.
Within a run the ids are distinct by construction; two ids of different runs
are equal only if two independent 64-bit prefixes are equal and two 256-wide
windows of 64-bit counters overlap (probability below 2^-119 per pair of runs),
so collisions are no likelier than with 16 fully random bytes.

What an id reveals: nothing about a value, a time or the device beyond what the
collector sees anyway. Ids of one run show that their reports come from the
same device and in which order it recorded them; the collector already knows
the device (it authenticated the caller, DESIGN.md: the subject) and the order
(a batch lists reports in recording order). Measured effect on the collector's
SQLite ledger in docs/sdk.md ("Report ids").
"""

from __future__ import annotations

import secrets
import threading

from fedldp.client.wire import REPORT_ID_BYTES

#: Ids per run (one prefix): at least the SDK's default batch size (100), so a
#: batch spans one or two runs.
RUN_LENGTH = 256
_PREFIX_BYTES = 8
_COUNTER_MODULUS = 1 << 64


class ReportIds:
    """A thread-safe source of report ids (see the module docstring for the layout).

    Every id is 16 bytes; prefixes and starts come from `secrets` (never from a
    caller's seeded generator: ids must be unpredictable to other devices).
    """

    def __init__(self, run_length: int = RUN_LENGTH) -> None:
        if isinstance(run_length, bool) or not isinstance(run_length, int) or run_length < 1:
            raise ValueError("run_length must be a positive integer")
        self._run_length = run_length
        self._lock = threading.Lock()
        self._prefix = b""
        self._start = 0
        self._used = run_length  # the first call begins a run

    def next(self) -> bytes:
        """A new report id: the next of the current run, or the first of a new run."""
        with self._lock:
            if self._used >= self._run_length:
                self._prefix = secrets.token_bytes(_PREFIX_BYTES)
                self._start = secrets.randbits(64)
                self._used = 0
            counter = (self._start + self._used) % _COUNTER_MODULUS
            self._used += 1
            return self._prefix + counter.to_bytes(REPORT_ID_BYTES - _PREFIX_BYTES, "big")
