"""A device process for the crash tests (run as a script; the test kills it with SIGKILL).

usage: sdk_crash_child.py PHASE TARGET STATE_DIR TRUST_DIR TOKEN
  record  record one value, print "PERSISTED <report id hex>", then wait to be killed
  send    record one value, print "PERSISTED <report id hex>", then flush (killed mid-send)
  resume  flush whatever the outbox holds, print "FLUSHED <acknowledged> <duplicates>"
  roundtrip  record one value and flush it, print "FLUSHED <acknowledged> <duplicates>"
"""

from __future__ import annotations

import sys
import time

from fedldp.client.sdk import Client
from fedldp.client.transport import Backoff, Credentials


def main() -> None:
    phase, target, state_dir, trust_dir, token = sys.argv[1:6]
    client = Client(
        target,
        trust_root=trust_dir,
        state_dir=state_dir,
        credentials=Credentials.insecure_bearer(token),
        timeout_seconds=5.0,
        backoff=Backoff(base_seconds=0.01, max_seconds=0.05),
    )
    if phase in ("record", "send"):
        recorded = client.record("browser.homepage", "mail.example")
        print("PERSISTED", recorded.report_id.hex(), flush=True)
        if phase == "record":
            time.sleep(600)
        client.flush(timeout=30)
        print("NOT KILLED", flush=True)
    else:
        if phase == "roundtrip":
            client.record("browser.homepage", "mail.example")
        flushed = client.flush(timeout=30)
        print("FLUSHED", flushed.acknowledged, flushed.duplicates, flush=True)
    client.close()


if __name__ == "__main__":
    main()
