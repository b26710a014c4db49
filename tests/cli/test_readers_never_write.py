"""A read never writes: every command that reads a SQLite ledger leaves its folder
exactly as it found it, whether the collector is stopped (no ``-wal``: SQLite must
not create ``-wal``/``-shm`` files, or leave them behind) or running with its write-ahead
log open. Compared before and after each reader: the folder's listing and mtime,
and each file's mode, size, mtime and bytes (the ``-shm`` file, the log's shared-memory
index where every SQLite reader takes its read locks, by mode only). And while a
collector ingests without pause, readers succeed and the folder lists the same files.
One ledger, and a ledger of two shards; real collectors write them over gRPC.

Broken variant caught: opening with ``mode=ro`` alone (what `open_ledger(access="read")`,
the dashboard and `ledger backup` did) leaves empty ``-wal``/``-shm`` files beside a
ledger whose collector is stopped.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from collector_testkit import Deployment, coarse, make_report, write_config
from fedldp.aggregator.dashboard.model import Options
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import open_ledger
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

from fedldp.cli import main
from fedldp.cli_dashboard import load_dashboard

SUBJECTS = [f"device-{i}" for i in range(24)]
Snapshot = dict[str, tuple[Any, ...]]


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    import time

    d = Deployment.create(now=int(time.time()))
    d.add_categorical("color", labels=("red", "green", "blue", "other"))
    return d


@dataclass
class Site:
    """A ledger (one file, or two shards) in its own folder, and what readers need."""

    folder: Path  # holds the ledger's files and nothing else
    urls: list[str]
    config: Path  # collector.toml: ledger_url, or ledger_shards
    base: Path  # policies/, trust/, keys, outputs


def snapshot(folder: Path) -> Snapshot:
    """The folder's mtime and, per file, its mode, size, mtime and SHA-256."""
    out: Snapshot = {".": (folder.stat().st_mtime_ns,)}
    for name in sorted(os.listdir(folder)):
        st = (folder / name).lstat()
        if name.endswith("-shm"):
            out[name] = (stat.S_IMODE(st.st_mode),)
        else:
            digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
            out[name] = (stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return out


def _feed(
    deployment: Deployment, address: str, subjects: Iterable[str], *, tolerant: bool = False
) -> int:
    """Submit two reports of each subject over gRPC; the batches accepted. Each must
    be, unless `tolerant` (a load generator: a batch the collector sheds is skipped)."""
    policy = deployment.verified(deployment.envelopes[0])
    accepted = 0
    with grpc.insecure_channel(address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        for i, subject in enumerate(subjects):
            reports = [
                make_report(policy, CategoryOutput((i + j) % 4), coarse_time=coarse(deployment.now))
                for j in range(2)
            ]
            try:
                got = stub.Submit(
                    pb.SubmitRequest(reports=reports),
                    metadata=bearer_metadata(deployment.token(subject)),
                )
            except grpc.RpcError:
                if tolerant:
                    continue
                raise
            ok = {o.outcome for o in got.outcomes} == {pb.OUTCOME_ACCEPTED}
            assert ok or tolerant
            accepted += ok
    return accepted


def _collect(deployment: Deployment, urls: list[str]) -> RunningCollector:
    """A collector over `urls`, fed every subject's reports over gRPC."""
    config = (
        deployment.config(urls[0]) if len(urls) == 1 else deployment.config("", ledger_shards=urls)
    )
    collector = start_collector(config, registry=deployment.registry())
    _feed(deployment, collector.address, SUBJECTS)
    return collector


def _site(deployment: Deployment, tmp_path: Path, shards: int) -> Site:
    folder = tmp_path / "ledger"
    folder.mkdir()
    names = ["ledger.db"] if shards == 1 else [f"shard{i}.db" for i in range(shards)]
    urls = [f"sqlite:///{folder / n}" for n in names]
    settings: dict[str, Any] = {"ledger_shards": urls} if shards > 1 else {}
    config = write_config(deployment, tmp_path, urls[0] if shards == 1 else "", "c", **settings)
    _collect(deployment, urls).stop(1.0)
    return Site(folder, urls, config, tmp_path)


def _release_with_receipt(site: Site) -> list[str]:
    """A central release with a signed receipt (writes the ledger, before any snapshot);
    the options that verify it."""
    runner = CliRunner()
    made = runner.invoke(main, ["keys", "generate", "--out", str(site.base), "--name", "rcpt"])
    assert made.exit_code == 0, made.output
    url = site.urls[0]
    with open_ledger(url, access="write") as led:
        led.set_central_cap("team", "weekly", epsilon_cap=Decimal(5), delta_cap=Decimal(0))
    data = site.base / "data.txt"
    data.write_text("1\n2\n3\n", encoding="utf-8")
    receipt = site.base / "receipt.json"
    released = runner.invoke(
        main,
        [
            "release", "count", "--ledger", url, "--subject", "team", "--purpose", "weekly",
            "--epsilon", "1", "--key", "k1", "--data", str(data),
            "--receipt", str(receipt), "--signing-key", str(site.base / "rcpt.key"),
        ],
    )  # fmt: skip
    assert released.exit_code == 0, released.output
    return [str(receipt), "--trusted-key", str(site.base / "rcpt.pub")]


def _readers(site: Site, receipt: list[str]) -> dict[str, list[str]]:
    """Every reader command (name -> arguments) on the site's whole ledger."""
    whole = ["--config", str(site.config)]
    folders = ["--policies", str(site.base / "policies"), "--trust", str(site.base / "trust")]
    out = site.base / "out"
    out.mkdir(exist_ok=True)
    commands = {
        "ledger show": ["ledger", "show", SUBJECTS[0], *whole],
        "ledger reconcile": ["ledger", "reconcile", *whole],
        "report": ["report", "--policy", "color", *whole, "--format", "json", "--audit"],
        "release-service consolidate": [
            "release-service",
            "consolidate",
            "--policy",
            "color",
            *whole,
            *folders,
            "--out",
            f"sqlite:///{out / 'consolidated.db'}",
        ],
        # central state: the ledger, or shard 0
        "ledger reservations": ["ledger", "reservations", "--ledger", site.urls[0]],
        "release spend": [
            "release",
            "spend",
            "--subject",
            "team",
            "--purpose",
            "weekly",
            "--ledger",
            site.urls[0],
        ],
        "verify release": ["verify", "release", *receipt, "--ledger", site.urls[0]],
    }
    if len(site.urls) > 1:
        commands["ledger shards show"] = ["ledger", "shards", "show", *whole]
    else:  # a sharded ledger is backed up shard by shard (any shard's URL)
        commands["ledger backup"] = [
            "ledger", "backup", "--ledger", site.urls[0], str(out / f"b{len(os.listdir(out))}.bak")
        ]  # fmt: skip
    return commands


def _dashboard(site: Site) -> None:
    """What `fedldp dashboard` reads: the index, every report and the budget."""
    ledger = site.urls if len(site.urls) > 1 else site.urls[0]
    dash = load_dashboard(ledger, site.base / "policies", site.base / "trust", "default")
    try:
        assert dash.index()[0].latest_n >= 2 * len(SUBJECTS)
        dash.report("color", None, Options())
        assert dash.budget().policies["color"][0].subjects >= len(SUBJECTS)
    finally:
        dash.ledger.close()


def _check_every_reader(site: Site, receipt: list[str]) -> None:
    before = snapshot(site.folder)
    for name, args in _readers(site, receipt).items():
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (name, result.output)
        assert snapshot(site.folder) == before, name
    _dashboard(site)
    assert snapshot(site.folder) == before, "dashboard"


@pytest.fixture(params=[1, 2], ids=["one-ledger", "two-shards"])
def site(request: pytest.FixtureRequest, deployment: Deployment, tmp_path: Path) -> Site:
    return _site(deployment, tmp_path, int(request.param))


def test_readers_leave_a_stopped_collectors_ledger_untouched(site: Site) -> None:
    receipt = _release_with_receipt(site)
    assert not [n for n in os.listdir(site.folder) if n.endswith(("-wal", "-shm"))]
    _check_every_reader(site, receipt)
    assert not [n for n in os.listdir(site.folder) if n.endswith(("-wal", "-shm"))]


def test_readers_leave_a_running_collectors_ledger_untouched(
    site: Site, deployment: Deployment
) -> None:
    """The collector has just written every shard (its logs are open) and stays up."""
    receipt = _release_with_receipt(site)
    collector = _collect(deployment, site.urls)
    try:
        assert all(Path(u.removeprefix("sqlite:///") + "-wal").exists() for u in site.urls)
        _check_every_reader(site, receipt)
    finally:
        collector.stop(1.0)


def test_readers_create_nothing_while_a_collector_writes(
    site: Site, deployment: Deployment
) -> None:
    """Readers run while a collector ingests without pause: each succeeds and the
    folder lists the same files (its bytes change: the collector is writing)."""
    collector = _collect(deployment, site.urls)
    readers = _readers(site, _release_with_receipt(site))
    names = sorted(os.listdir(site.folder))
    done = threading.Event()
    fed: list[int] = []

    def busy() -> Iterator[str]:
        for i in itertools.count():
            if done.is_set() or i == 100_000:
                return
            yield f"busy-{i}"

    def write() -> None:
        fed.append(_feed(deployment, collector.address, busy(), tolerant=True))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for name in ("ledger show", "ledger reconcile", "ledger reservations"):
            result = CliRunner().invoke(main, readers[name])
            assert result.exit_code == 0, (name, result.output)
            assert sorted(os.listdir(site.folder)) == names, name
        _dashboard(site)
        assert sorted(os.listdir(site.folder)) == names, "dashboard"
    finally:
        done.set()
        writer.join()
        collector.stop(1.0)
    assert fed and fed[0] > 0  # the collector stored reports while the readers ran
