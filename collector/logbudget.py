"""A bounded rate of log lines: at most `lines` per `interval` seconds, the rest counted.

Shared by the collector's refusal log (collector/server.py) and ledger failure log
(collector/committer.py): a flood writes at most `lines` + 1 lines per interval,
the extra one reporting how many were not logged when the next interval starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogBudget:
    """Admits at most `lines` log lines per `interval` seconds; counts the others."""

    def __init__(
        self,
        *,
        lines: int = 10,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = -float("inf")
        self._logged = 0
        self._suppressed = 0

    def admit(self) -> tuple[bool, int]:
        """(whether this line may be written, lines suppressed in the interval just ended)."""
        now = self._clock()
        with self._lock:
            suppressed = 0
            if now - self._window_start >= self.interval:
                suppressed, self._suppressed = self._suppressed, 0
                self._window_start, self._logged = now, 0
            allowed = self._logged < self.lines
            if allowed:
                self._logged += 1
            else:
                self._suppressed += 1
        return allowed, suppressed


__all__ = ["LogBudget"]
