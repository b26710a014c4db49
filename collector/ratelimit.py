"""Per-subject token-bucket rate limiting with bounded memory."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """`rate` requests per second per subject with bursts up to `burst`.

    Memory is bounded: at most `max_subjects` buckets are kept, least recently
    used evicted first (an evicted subject starts again with a full bucket,
    which can only let it through sooner, never lock it out).
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_subjects: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self.max_subjects = max_subjects
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self, subject: str) -> float:
        """Take one token for `subject`: 0.0 if allowed, else seconds until one is free."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.pop(subject, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[subject] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[subject] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self.max_subjects:
                self._buckets.popitem(last=False)
            return wait
