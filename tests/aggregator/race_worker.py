"""A separate process for the one-owner-per-reservation tests (run with `python FILE`).

    python race_worker.py release URL KEY MARKER GO OUT
    python race_worker.py train CONFIG.json MARKER GO OUT

(or `release_outcome` called in the test's own process, as the run that must not read).

The data loader first appends a line to MARKER (so the test counts reads across
processes), then waits for the file GO to exist (so the test decides when the
first run may finish). OUT receives one JSON line: the outcome.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

WAIT_SECONDS = 120


def _gated(marker: Path, go: Path, rows: Any) -> Any:
    with marker.open("a") as fh:
        fh.write("read\n")
    deadline = time.monotonic() + WAIT_SECONDS
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never let this run finish")
        time.sleep(0.05)
    return rows


def release_outcome(url: str, key: str, load: Callable[[], Any]) -> dict[str, Any]:
    """One private sum of 1..100 under idempotency `key` with the data loader `load`:
    {"ok": value, "reservation": id} or {"error": exception name, "message": ...}."""
    from fedldp.aggregator.central.releases import ReleaseError, private_sum
    from fedldp.collector.ledger import open_ledger

    with open_ledger(url) as ledger:
        try:
            rel = private_sum(
                ledger,
                subject="team",
                purpose="race",
                epsilon=Decimal(1),
                idempotency_key=key,
                now=int(time.time()),
                load=load,
                lower=Decimal(0),
                upper=Decimal(100),
            )
            return {"ok": str(rel.value), "reservation": rel.reservation_id}
        except ReleaseError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}


def release(url: str, key: str, marker: Path, go: Path, out: Path) -> None:
    data = [Decimal(x) for x in range(1, 101)]
    out.write_text(json.dumps(release_outcome(url, key, lambda: _gated(marker, go, data))))


def train(config_json: Path, marker: Path, go: Path, out: Path) -> None:
    import warnings

    from fedldp.aggregator.training import (
        BudgetRefusedError,
        config_from_mapping,
        load_dataset,
        train_private,
    )

    warnings.filterwarnings("ignore")
    config = config_from_mapping(json.loads(config_json.read_text()))
    try:
        res = train_private(config, load=lambda cfg: _gated(marker, go, load_dataset(cfg)))
        result: dict[str, Any] = {"ok": res.reservation_id}
    except BudgetRefusedError as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1] == "release":
        release(sys.argv[2], sys.argv[3], *(Path(a) for a in sys.argv[4:7]))
    else:
        train(*(Path(a) for a in sys.argv[2:6]))
