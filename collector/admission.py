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
import time
from collections import OrderedDict, deque
from collections.abc import Callable

#: The retry hint of an overload refusal: this many milliseconds, scaled by a
#: random factor in [0.5, 1.5) so that refused devices do not come back together.
RETRY_AFTER_MS = 500


#: The longest retry hint `RefusalHints` gives a subject that keeps being refused.
MAX_RETRY_AFTER_MS = 30_000


def retry_after_ms(base: float = RETRY_AFTER_MS) -> int:
    """A jittered retry hint for an overload refusal, in milliseconds: `base`
    scaled by a random factor in [0.5, 1.5)."""
    return max(1, int(base * (0.5 + random.random())))  # jitter, not a secret


class RefusalHints:
    """Retry hints that grow for a subject that keeps being refused for its own calls.

    A refusal the subject itself causes (its share of the byte budget full, its
    body not sent within the deadline) counts in the subject's streak; its hint
    is `RETRY_AFTER_MS` doubled once per refusal of the streak before it, at
    most `max_ms` (the jitter of `retry_after_ms` on top). A streak is forgotten
    once the subject has not been refused for `forget_after` seconds; so a
    device that reopens every refused call (at once or after its hint) is told
    to wait up to `max_ms` after a handful of refusals, while one refused once
    now and then always gets the base hint. Overload refusals that the server's
    load causes do not count. At most `max_subjects` streaks are kept (least
    recently refused forgotten first), so the memory is bounded whatever the
    subjects. `base_ms` and `max_ms` default to the module's `RETRY_AFTER_MS` and
    `MAX_RETRY_AFTER_MS` as they are when the hints are made.
    """

    def __init__(
        self,
        *,
        base_ms: float | None = None,
        max_ms: float | None = None,
        forget_after: float = 60.0,
        max_subjects: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_ms = RETRY_AFTER_MS if base_ms is None else base_ms
        self.max_ms = MAX_RETRY_AFTER_MS if max_ms is None else max_ms
        self.forget_after = forget_after
        self.max_subjects = max_subjects
        self._clock = clock
        self._streaks: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()
        #: the streak length past which doubling `base_ms` reaches `max_ms`
        self._top = int(max(1.0, self.max_ms / self.base_ms)).bit_length()

    def refused(self, subject: str) -> int:
        """Count one refusal of `subject` caused by its own calls; its hint in ms."""
        now = self._clock()
        with self._lock:
            streak, last = self._streaks.pop(subject, (0, now))
            if now - last > self.forget_after:
                streak = 0
            self._streaks[subject] = (streak + 1, now)
            while len(self._streaks) > self.max_subjects:
                self._streaks.popitem(last=False)
        grown = min(self.max_ms, self.base_ms * 2 ** min(streak, self._top))
        return min(int(self.max_ms), retry_after_ms(grown))

    def streak(self, subject: str) -> int:
        """Refusals in `subject`'s current streak (tests, metrics)."""
        with self._lock:
            streak, last = self._streaks.get(subject, (0, 0.0))
            return streak if self._clock() - last <= self.forget_after else 0


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
