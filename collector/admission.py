"""Admission control: Collector RPCs in progress and request bytes in flight.

A request is admitted before its body is read (the handlers take the request
stream, not the message: collector/server.py), in this order: a slot among
`max_rpcs` RPCs in progress (refused at once when none is free), then room for
`reserve` bytes — the largest message the transport accepts — under the total
budget, its connection's budget and its subject's budget (waiting up to the
admission wait for room under the first two, then refused; refused at once when
its own subject already holds its share). Once its body is read the request
holds its real size until it is answered. So at any time the bytes of all
requests being read or handled are at most `max_bytes`, at most
`max_connection_bytes` per connection and at most `max_subject_bytes` per
subject, whatever the clients send; a refused request was never read.

How long a reservation may wait for its body is the server's business (the
body deadline, collector/server.py): the subject's share bounds how much one
enrolled device can hold, the deadline for how long.

Two flavours of waiting share one set of counts: the asyncio server's handlers
(all on its event loop thread) wait on futures granted in arrival order; the
sync server's handler threads wait on a condition variable.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque

#: The retry hint of an overload refusal: this many milliseconds, scaled by a
#: random factor in [0.5, 1.5) so that refused devices do not come back together.
RETRY_AFTER_MS = 500


def retry_after_ms() -> int:
    """A jittered retry hint for an overload refusal, in milliseconds."""
    return max(1, int(RETRY_AFTER_MS * (0.5 + random.random())))  # jitter, not a secret


class Admission:
    """Counts of RPCs in progress and reserved request bytes, total and per connection."""

    def __init__(
        self,
        *,
        max_rpcs: int,
        max_bytes: int,
        max_connection_bytes: int,
        max_subject_bytes: int | None = None,
    ) -> None:
        subject_bytes = max_bytes if max_subject_bytes is None else max_subject_bytes
        if (
            not 0 < max_connection_bytes <= max_bytes
            or not 0 < subject_bytes <= max_bytes
            or max_rpcs < 1
        ):
            raise ValueError(
                "0 < max_connection_bytes <= max_bytes, 0 < max_subject_bytes <= max_bytes "
                "and max_rpcs >= 1"
            )
        self.max_rpcs = max_rpcs
        self.max_bytes = max_bytes
        self.max_connection_bytes = max_connection_bytes
        self.max_subject_bytes = subject_bytes
        self.rpcs = 0
        self.bytes = 0
        self._by_peer: dict[str, int] = {}  # only connections holding bytes
        self._by_subject: dict[str, int] = {}  # only subjects holding bytes
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._waiters: deque[tuple[str, str, int, asyncio.Future[bool]]] = deque()

    # -- RPC slots --

    def enter(self) -> bool:
        """Take a slot for one RPC; False (nothing taken) when all are in use."""
        with self._lock:
            if self.rpcs >= self.max_rpcs:
                return False
            self.rpcs += 1
            return True

    def leave(self) -> None:
        """Give back the slot `enter` took."""
        with self._lock:
            self.rpcs -= 1

    # -- bytes --

    def held_by(self, subject: str) -> int:
        """Bytes `subject` holds now (tests, metrics)."""
        with self._lock:
            return self._by_subject.get(subject, 0)

    def subject_full(self, subject: str, n: int) -> bool:
        """Whether `subject`'s own reservations leave no room for `n` more bytes (such
        a request is refused at once, without waiting: only its own calls free it)."""
        with self._lock:
            return self._subject_full(subject, n)

    def only_subject_full(self, subject: str, n: int) -> bool:
        """Whether `subject`'s share is full while the server's total still has room
        for `n` bytes: the subject's own calls, not the server's load, refuse it."""
        with self._lock:
            return self._subject_full(subject, n) and self.bytes + n <= self.max_bytes

    def _subject_full(self, subject: str, n: int) -> bool:
        """`subject_full`, with the lock held."""
        return bool(subject) and self._by_subject.get(subject, 0) + n > self.max_subject_bytes

    def _fits(self, peer: str, subject: str, n: int) -> bool:
        return (
            self.bytes + n <= self.max_bytes
            and self._by_peer.get(peer, 0) + n <= self.max_connection_bytes
            and not self._subject_full(subject, n)
        )

    def _take(self, peer: str, subject: str, n: int) -> None:
        self.bytes += n
        self._by_peer[peer] = self._by_peer.get(peer, 0) + n
        if subject:
            self._by_subject[subject] = self._by_subject.get(subject, 0) + n

    def _give(self, peer: str, subject: str, n: int) -> None:
        self.bytes -= n
        left = self._by_peer[peer] - n
        if left:
            self._by_peer[peer] = left
        else:
            del self._by_peer[peer]
        if subject:
            left = self._by_subject[subject] - n
            if left:
                self._by_subject[subject] = left
            else:
                del self._by_subject[subject]

    def reserve(self, peer: str, n: int, *, timeout: float, subject: str = "") -> bool:
        """Sync server: reserve `n` bytes for connection `peer` and `subject`, waiting up
        to `timeout` s for room; False (nothing reserved) if there was none, at once
        when `subject` already holds its share."""
        with self._room:
            if self._subject_full(subject, n):
                return False
            if not self._room.wait_for(lambda: self._fits(peer, subject, n), timeout=timeout):
                return False
            self._take(peer, subject, n)
            return True

    async def reserve_async(self, peer: str, n: int, *, timeout: float, subject: str = "") -> bool:
        """asyncio server (call on its event loop): as `reserve`; waiters are served
        in arrival order as bytes are released."""
        with self._lock:
            if self._subject_full(subject, n):
                return False
            if not self._waiters and self._fits(peer, subject, n):
                self._take(peer, subject, n)
                return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (peer, subject, n, future)
        self._waiters.append(entry)
        granted = False
        try:
            granted = await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if not granted:  # timed out or cancelled: nothing may stay reserved
                with self._lock:
                    if future.done() and not future.cancelled():
                        self._give(peer, subject, n)  # granted just as the wait ended
                    future.cancel()
                    if entry in self._waiters:
                        self._waiters.remove(entry)
                self._grant_waiters()
        return granted

    def resize(self, peer: str, held: int, n: int, *, subject: str = "") -> None:
        """Change the reservation of a request from `held` to `n` <= `held` bytes."""
        self.release(peer, held - n, subject=subject)

    def release(self, peer: str, n: int, *, subject: str = "") -> None:
        """Give back `n` reserved bytes of connection `peer` and `subject`; wake waiters."""
        if n <= 0:
            return
        with self._room:
            self._give(peer, subject, n)
            self._room.notify_all()
        if self._waiters:
            self._grant_waiters()

    def _grant_waiters(self) -> None:
        """Grant waiting asyncio requests that fit now, in arrival order (a waiter
        its connection's or subject's budget holds back does not block the others)."""
        with self._lock:
            for entry in list(self._waiters):
                peer, subject, n, future = entry
                if future.done():
                    continue
                if self.bytes + n > self.max_bytes:
                    break
                if self._fits(peer, subject, n):
                    self._take(peer, subject, n)
                    self._waiters.remove(entry)
                    future.set_result(True)
