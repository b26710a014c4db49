"""A device process sharing a state folder with others (run as a script by test_sdk_outage.py).

usage: sdk_sender_child.py TARGET STATE_DIR TRUST_DIR TOKEN GATE [TIMEOUT_S]
  Prints "READY", waits for a line on stdin (so every process starts sending at
  once), flushes the shared outbox against TARGET in batches of 2, prints
  "FLUSHED <acknowledged>". GATE is "stored" (the SDK as shipped), "lease" (the
  fallback for platforms without flock: the send slot is the stored claim, not
  an OS lock) or "local" (the broken variant: each process keeps its own
  in-memory gate and never reads the stored one or claims the send slot, as
  before the fix). TIMEOUT_S: the client's call deadline (default 5).
"""

from __future__ import annotations

import sys

from fedldp.client import send_slot
from fedldp.client.outbox import Outbox, OutboxEntry, SendGate
from fedldp.client.sdk import Client
from fedldp.client.transport import Backoff, Credentials


def local_claim_due(self: Outbox, gate: SendGate, now: float, limit: int) -> list[OutboxEntry]:
    """The broken variant: the process's own copy of the gate, no stored read, no slot."""
    if gate.state.resume_at > now:
        return []
    return self.due(now, limit)


def main() -> None:
    target, state_dir, trust_dir, token, gate = sys.argv[1:6]
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 5.0
    if gate == "local":
        Outbox.claim_due = local_claim_due  # type: ignore[method-assign]
    if gate == "lease":
        send_slot.available = lambda: False
    client = Client(
        target,
        trust_root=trust_dir,
        state_dir=state_dir,
        credentials=Credentials.insecure_bearer(token),
        timeout_seconds=timeout,
        batch_size=2,
        background=False,
        fetch_policies=False,
        backoff=Backoff(base_seconds=0.01, max_seconds=0.05),
    )
    print("READY", flush=True)
    sys.stdin.readline()
    result = client.flush(timeout=60)
    print("FLUSHED", result.acknowledged, flush=True)
    client.close()


if __name__ == "__main__":
    main()
