"""Where the SDK's events go: the state file's bounded log and counters, the log, the app.

An `Event` (drops, refusals, rejected policies, transport errors) never carries
a recorded value. `EventSink.record` persists one (counter + bounded log, one
transaction) and then emits it; `emit` alone is for events already persisted in
the caller's own transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fedldp.client.device_store import DeviceStore, Event

logger = logging.getLogger("fedldp.client")

#: The app's callback for each event (`Client(on_event=...)`).
EventCallback = Callable[[Event], None]


class EventSink:
    """Persists, logs and forwards events of one client.

    Thread-safe: the store serializes its transactions, and `emit` holds no state.
    """

    def __init__(self, store: DeviceStore, on_event: EventCallback | None) -> None:
        """Events go to `store` and, when given, to `on_event`."""
        self._store = store
        self._on_event = on_event

    def record(self, event: Event) -> None:
        """Persist an event (bounded log + the counter ``<kind>s``), then emit it."""
        with self._store.transaction() as conn:
            DeviceStore.bump(conn, f"{event.kind}s")
            DeviceStore.add_event(conn, event)
        self.emit(event)

    def emit(self, event: Event) -> None:
        """Log `event` at WARNING and call the app's callback.

        An exception raised by the callback is logged and swallowed: the app's
        bug never breaks a record or a send.
        """
        logger.warning(
            "fedldp event %s/%s%s: %s",
            event.kind,
            event.reason,
            f" policy={event.policy_id}" if event.policy_id else "",
            event.detail,
        )
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("fedldp: on_event callback raised; ignored")


__all__ = ["EventCallback", "EventSink"]
