"""`fedldp client`: inspect a device's SDK state (policies, outbox, budget, events).

Reads the state file in ``--state-dir`` (the `Client`'s `state_dir`); never
contacts the collector and never shows a raw value (the state holds none: the
outbox holds randomized reports, the memo table keyed hashes). Pass ``--json``
for machine-readable output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from fedldp.cli_common import iso_utc

_STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The SDK's state directory (Client(state_dir=...)).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@contextmanager
def _store(state_dir: Path) -> Iterator[Any]:
    """The state file in `state_dir`, opened read-only (DeviceStore(read_only=True)).

    Reading never writes: the file's bytes, mode and times stay as they were and
    nothing is created beside it. A missing file, a file that is not a state file
    and a schema other than this fedldp's are one-line errors (StateError, exit 1).
    """
    from fedldp.client.device_store import DeviceStore, StateError

    try:
        store = DeviceStore(state_dir, read_only=True)
    except StateError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield store
    finally:
        store.close()


def _when(ts: float | int | None) -> str:
    if not ts:
        return "-"
    return iso_utc(ts)


def _emit(rows: list[dict[str, Any]], as_json: bool, columns: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        click.echo("(none)")
        return
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    click.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        click.echo("  ".join(str(r[c]).ljust(widths[c]) for c in columns))


def _cached_caps(store: Any) -> dict[str, tuple[int, Decimal, int]]:
    """policy id -> (version, cap, window seconds), parsed from the cached envelopes."""
    from fedldp.v1 import policy_pb2

    caps: dict[str, tuple[int, Decimal, int]] = {}
    for p in store.policies():
        envelope = policy_pb2.SignedEnvelope.FromString(p.envelope)
        message = policy_pb2.Policy.FromString(envelope.payload)
        caps[p.policy_id] = (
            p.version,
            Decimal(message.budget.epsilon_cap),
            int(message.budget.window_seconds),
        )
    return caps


@click.group(name="client")
def client() -> None:
    """Inspect the device SDK's on-device state (read-only, offline)."""


@client.command()
@_STATE_DIR
@_JSON
def status(state_dir: Path, as_json: bool) -> None:
    """Counters, pending reports, trusted root version, cached policies."""
    from fedldp.client.outbox import Outbox

    with _store(state_dir) as store:
        with store.transaction() as conn:
            row = conn.execute("SELECT root_version FROM trust WHERE id=1").fetchone()
        data = {
            "state_file": str(store.path),
            "size_bytes": sum(
                f.stat().st_size for f in store.path.parent.glob(store.path.name + "*")
            ),
            "root_version": None if row is None else int(row[0]),
            "policies": len(store.policies()),
            "pending_reports": Outbox(store).pending(),
            "memoized_values": store.memo_count(),
            "policies_fetched_at": _when(float(store.get_meta("policies_fetched_at") or 0) or None),
            "counters": store.counters(),
        }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        if key == "counters":
            click.echo("counters:")
            for name, count in value.items():
                click.echo(f"  {name}: {count}")
        else:
            click.echo(f"{key}: {value}")


@client.command()
@_STATE_DIR
@_JSON
def policies(state_dir: Path, as_json: bool) -> None:
    """Cached policies (verified when fetched, re-verified by the SDK on every start)."""
    with _store(state_dir) as store:
        caps = _cached_caps(store)
        highest = store.highest_versions()
        rows = [
            {
                "policy_id": p.policy_id,
                "version": p.version,
                "highest_seen": highest.get(p.policy_id, p.version),
                "metric": p.metric,
                "epsilon": str(p.epsilon),
                "cap_per_window": str(caps[p.policy_id][1]),
                "window_s": caps[p.policy_id][2],
                "expires": _when(p.expires_at),
                "fetched": _when(p.fetched_at),
                "digest": p.digest.hex()[:16],
            }
            for p in store.policies()
        ]
    _emit(rows, as_json, list(rows[0]) if rows else [])


@client.command()
@_STATE_DIR
@_JSON
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most rows shown."
)
def outbox(state_dir: Path, as_json: bool, limit: int) -> None:
    """Reports waiting for acknowledgement (ids and bookkeeping; no payloads)."""
    from fedldp.client.outbox import Outbox

    with _store(state_dir) as store:
        entries = Outbox(store).entries(limit)
        total = Outbox(store).pending()
    rows = [
        {
            "report_id": e.report_id.hex(),
            "policy": f"{e.policy_id} v{e.policy_version}",
            "epsilon": str(e.epsilon),
            "created": _when(e.created_at),
            "attempts": e.attempts,
            "next_attempt": _when(e.next_attempt_at),
            "bytes": len(e.report),
            "last_error": e.last_error or "-",
        }
        for e in entries
    ]
    _emit(rows, as_json, list(rows[0]) if rows else [])
    if not as_json and total > len(rows):
        click.echo(f"... {total - len(rows)} more")


@client.command()
@_STATE_DIR
@_JSON
@click.option(
    "--now",
    type=click.IntRange(min=0),
    default=None,
    help="Unix time for 'current window' (default: now).",
)
def budget(state_dir: Path, as_json: bool, now: int | None) -> None:
    """Epsilon spent and left per policy in the current window (the device's own ledger)."""
    current = int(time.time()) if now is None else now
    with _store(state_dir) as store:
        caps = _cached_caps(store)
        spent = {(r.policy_id, r.window_start): r for r in store.budget_rows()}
    rows = []
    for policy_id, (version, cap, window) in sorted(caps.items()):
        start = current - current % window
        row = spent.get((policy_id, start))
        used = row.spent if row else Decimal(0)
        rows.append(
            {
                "policy_id": policy_id,
                "version": version,
                "window_start": _when(start),
                "window_end": _when(start + window),
                "reports": row.reports if row else 0,
                "epsilon_spent": str(used),
                "epsilon_cap": str(cap),
                "epsilon_left": str(max(Decimal(0), cap - used)),
            }
        )
    _emit(rows, as_json, list(rows[0]) if rows else [])


@client.command()
@_STATE_DIR
@_JSON
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most events shown."
)
def events(state_dir: Path, as_json: bool, limit: int) -> None:
    """Recent drops, refusals and rejected policies, newest first."""
    with _store(state_dir) as store:
        rows = [
            {
                "at": _when(e.at),
                "kind": e.kind,
                "reason": e.reason,
                "policy": e.policy_id or "-",
                "report_id": e.report_id.hex() if e.report_id else "-",
                "detail": e.detail,
            }
            for e in store.events(limit)
        ]
    _emit(rows, as_json, list(rows[0]) if rows else [])


__all__ = ["client"]
