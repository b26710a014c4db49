"""The device's send slot: an OS lock on the state folder, held while a Submit call is in flight.

At most one Submit call per state folder is in flight, across every process and
`Client` sharing the folder (`fedldp.client.outbox.SendGate`). The slot is an
exclusive ``flock(2)`` on the state folder itself (an ``O_RDONLY`` descriptor of
the directory, one per `Client`, so two Clients in one process exclude each
other too; no extra file is created, so a closed client still leaves one file).
The kernel releases a ``flock`` when the last descriptor of its open file
description closes, which includes the holder's death: a process killed with
``kill -9`` in the middle of a call frees the slot at once, and the next sender
(or the restarted app) sends without waiting for any lease to lapse.

The lock is taken without blocking (``LOCK_NB``): a sender that finds it taken
looks again every `fedldp.client.outbox.SLOT_POLL_SECONDS`. It is released only
after the call's outcome (and any pause it set) is committed to the state file,
and a sender reads the stored gate only after it holds the lock, so a call never
starts on a stale view of the gate.

Platforms without ``fcntl.flock`` (Windows): `available()` is False and the
gate falls back to the stored claim (`SendGate` with no slot: a ``holder`` and
``held_until`` in the gate's row, taken in a ``BEGIN IMMEDIATE`` transaction),
which a killed holder frees only when it lapses (``timeout_seconds`` + 5 s). A
state folder on a network file system whose ``flock`` is local to one client
machine (old NFS) is not shared safely between machines by either mechanism;
the SDK's state folder is app-private storage.

A descriptor is not inherited by child processes (``os.open`` makes it
non-inheritable), but a ``fork()`` without ``exec`` shares the parent's open
file description: a forked child that exits while the parent holds the slot does
not release it (the parent still has the descriptor), and a child must not send
on the parent's `Client`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def available() -> bool:
    """Whether this platform has ``flock`` (POSIX); otherwise the stored claim is used."""
    return fcntl is not None and hasattr(fcntl, "flock")


class SendSlot:
    """An exclusive, non-blocking ``flock`` on a state folder (thread-safe, idempotent).

    `try_acquire` takes it (True) or finds another descriptor holding it
    (False); taking it again while held is a no-op that returns True.
    `release` and `close` may be called any number of times.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        """Open a descriptor of `directory` (which must exist); OSError if it cannot."""
        if not available():  # pragma: no cover - Windows
            raise OSError("flock is not available on this platform")
        self.directory = Path(directory)
        self._fd: int | None = os.open(self.directory, os.O_RDONLY)
        self._held = False
        self._mutex = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether this slot holds the lock now."""
        return self._held

    def try_acquire(self) -> bool:
        """Take the lock without waiting; False when another holder has it."""
        with self._mutex:
            if self._fd is None:
                raise OSError("the send slot is closed")
            if self._held:
                return True
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self._held = True
            return True

    def release(self) -> None:
        """Free the lock if held (the outcome of the call is committed by then)."""
        with self._mutex:
            if self._held and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._held = False

    def close(self) -> None:
        """Release and close the descriptor (idempotent)."""
        with self._mutex:
            fd, self._fd, self._held = self._fd, None, False
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock


__all__ = ["SendSlot", "available"]
