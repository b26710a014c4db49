"""Device SDK figures: import cost, record() latency, outbox throughput, state size.

    python -m bench.sdk [--quick] [--json PATH] [--runs N]
    python -m bench.sdk --outage [--quick] [--json PATH]
    python -m bench.sdk --device-cpu [--quick] [--json PATH]

What is measured (medians over >= 5 runs, with min and max):

* **Import time and resident memory, core only.** A fresh interpreter with
  numpy, SciPy, SQLAlchemy, click, torch... blocked (importing them raises)
  imports `fedldp.client.sdk`; the timed section is that import statement,
  RSS is VmRSS right after it. The same child then builds a `Client` against a
  real collector, records and flushes 200 reports, and reports VmHWM (peak RSS).
  References in the same run: an empty interpreter, the three base dependencies
  alone (grpc, protobuf, cryptography), and `import numpy` (what the device
  avoids).
* **record() latency per call**, for GRR (k=16), OUE (k=64), memoized GRR and
  Piecewise (numeric). The timed section is `record()` only: policy lookup,
  budget check, randomization, serialization, and one SQLite transaction with
  WAL + synchronous=FULL (an fsync). References: the mechanism's `perturb`
  alone (the randomizer floor) and one bare SQLite INSERT+COMMIT with the same
  durability settings (the storage floor).
* **Outbox throughput**: reports/s enqueued (record() in a loop) and drained
  (`flush()` of N pending reports to a real collector over loopback gRPC, 100
  per call, every acknowledgement applied to the outbox). Reference: the same
  stored report bytes submitted straight with `Transport.submit_raw`, no
  outbox bookkeeping, to the same collector (under another subject).
* **Fresh install** (what `fedldp demo` does per simulated device): CPU of the
  device's thread for `Client()` on a new state folder, one record, one flush,
  close, with every device on one shared gRPC channel. Reference: the same two
  gRPC calls alone (GetPolicies, Submit) on that channel, same thread clock.
* **Device CPU** (``--device-cpu`` runs only this): process CPU of the
  device side with the collector in another process, so gRPC's own threads
  count and the collector's do not: a fresh install as `fedldp demo` runs it
  (and per phase), and the steady state of a long-lived Client (record() plus
  its share of flush(), per record). Reference: the two gRPC calls alone
  (`measure_device_cpu`).
* **State size per 1,000 pending reports**: the growth of the state file
  (the one file a closed client leaves) when 1,000 reports are recorded and
  not sent, measured with the public API only; the serialized report bytes
  themselves are the reference.
* **Outage** (``--outage``, alone): reports delivered and Submit calls made
  per minute during a collector outage and the same time after it, and the
  state folder's files at idle and with 1,000 / 10,000 pending (see
  `measure_outage` and `measure_state_files`).

The collector is the real one (`start_collector`, SQLite ledger, durable) in
this process, with its rate limit raised out of the way. Absolute times depend
on the machine's disk (fsync) and load; the ratios to the references are the
portable figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import Timing, fmt_float, fmt_rate, format_table, summarize, write_json

PACKAGES = ("grpcio", "protobuf", "cryptography", "numpy")
HEAVY = [
    "numpy",
    "scipy",
    "sqlalchemy",
    "click",
    "torch",
    "opacus",
    "matplotlib",
    "psycopg",
    "alembic",
    "prometheus_client",
    "sklearn",
]
LABELS_16 = [f"site{i}.example" for i in range(16)]
LABELS_64 = [f"app{i}" for i in range(64)]

_CHILD_PRELUDE = f"""
import json, sys, time
def _status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
    return 0
for _name in {HEAVY!r}:
    sys.modules[_name] = None
"""


# --- the world: a real collector, an authority, policies ---------------------------------


class World:
    """A collector with the benchmark's policies, and what a device needs to reach it."""

    def __init__(self, tmp: Path) -> None:
        from fedldp.authoring import Authority, write_envelope, write_public_key
        from fedldp.collector.auth import TokenAuthority
        from fedldp.collector.config import CollectorConfig
        from fedldp.collector.policies import PolicyRegistry
        from fedldp.collector.server import start_collector
        from fedldp.v1 import policy_pb2

        self.tmp = tmp
        now = int(time.time()) - 60
        self.authority = Authority.generate(now=now)
        a = self.authority
        common: dict[str, Any] = {
            "epsilon": "1",
            "epsilon_cap": "1000000",
            "window_seconds": 86400,
            "now": now,
            "min_reports": 1,
            "audience": ("default",),
        }
        policies = [
            a.categorical_policy(policy_id="grr", metric="m.grr", labels=LABELS_16, **common),
            a.categorical_policy(
                policy_id="oue", metric="m.oue", labels=LABELS_64, mechanism="oue", **common
            ),
            a.categorical_policy(
                policy_id="memo",
                metric="m.memo",
                labels=LABELS_16,
                mechanism="rappor-grr",
                params={"epsilon_permanent": "2"},
                memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,
                **common,
            ),
            a.numeric_policy(
                policy_id="num", metric="m.num", lo="0", hi="100", mechanism="piecewise", **common
            ),
        ]
        envelopes = [a.sign(p) for p in policies]
        secret = secrets.token_bytes(32)
        self.tokens = TokenAuthority(secret)
        registry = PolicyRegistry.from_envelopes(
            envelopes, a.trust_store(now=now + 60), now=int(time.time()), audience="default"
        )
        config = CollectorConfig(
            ledger_url=f"sqlite:///{tmp / 'ledger.db'}",
            token_secret=secret.hex(),
            rate_limit_per_second=1e9,
            rate_limit_burst=1e9,
            workers=8,
            log_level="ERROR",
        )
        self._config = config
        self._registry = registry
        self.collector = start_collector(config, registry=registry)
        self.trust_dir = tmp / "trust"
        (self.trust_dir / "pinned").mkdir(parents=True)
        write_public_key(a.root_public_keys[0], self.trust_dir / "pinned" / "root.pem")
        write_envelope(a.root_envelope, self.trust_dir / "1.root")

    def start_collector(self, name: str, listen: str = "127.0.0.1:0") -> Any:
        """Another collector with the same policies, on its own ledger file, at `listen`."""
        import dataclasses

        from fedldp.collector.server import start_collector

        config = dataclasses.replace(
            self._config, ledger_url=f"sqlite:///{self.tmp / (name + '.db')}", listen=listen
        )
        return start_collector(config, registry=self._registry)

    def token(self, subject: str) -> str:
        return self.tokens.mint(subject, expires_at=int(time.time()) + 86400)

    def client(
        self, state: Path, subject: str = "bench-device", target: str = "", **kwargs: Any
    ) -> Any:
        from fedldp.client.sdk import Client
        from fedldp.client.transport import Credentials

        return Client(
            target or self.collector.address,
            trust_root=self.trust_dir,
            state_dir=state,
            credentials=Credentials.insecure_bearer(self.token(subject)),
            **kwargs,
        )

    def close(self) -> None:
        self.collector.stop(grace=1.0)


# --- import time and memory (subprocesses) ------------------------------------------------


def _child(code: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD_PRELUDE + code],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _import_probe(statement: str, *, block_heavy: bool = True) -> str:
    prelude = "" if block_heavy else "for _n in list(sys.modules):\n    pass\n"
    return prelude + (
        "t = time.perf_counter()\n"
        f"{statement}\n"
        "dt = time.perf_counter() - t\n"
        "print(json.dumps({'seconds': dt, 'rss': _status('VmRSS')}))\n"
    )


def measure_imports(runs: int) -> dict[str, dict[str, Timing]]:
    probes = {
        "empty interpreter (reference)": "pass",
        "grpc + protobuf + cryptography (reference)": (
            "import grpc, google.protobuf, cryptography.hazmat.primitives.asymmetric.ed25519"
        ),
        "fedldp.client.sdk (core only)": "import fedldp.client.sdk",
    }
    results: dict[str, dict[str, Timing]] = {}
    for name, statement in probes.items():
        samples = [_child(_import_probe(statement)) for _ in range(runs)]
        results[name] = {
            "import_s": summarize([s["seconds"] for s in samples]),
            "rss_bytes": summarize([s["rss"] for s in samples]),
        }
    numpy_code = "del sys.modules['numpy']\n" + _import_probe("import numpy")
    samples = [_child(numpy_code) for _ in range(runs)]
    results["numpy (what the device avoids; reference)"] = {
        "import_s": summarize([s["seconds"] for s in samples]),
        "rss_bytes": summarize([s["rss"] for s in samples]),
    }
    return results


def measure_device_peak(world: World, runs: int, reports: int) -> dict[str, Timing]:
    samples = []
    for i in range(runs):
        state = world.tmp / f"peak-{i}"
        code = (
            "from fedldp.client.sdk import Client\n"
            "from fedldp.client.transport import Credentials\n"
            f"c = Client({world.collector.address!r}, trust_root={str(world.trust_dir)!r},\n"
            f"           state_dir={str(state)!r},\n"
            f"           credentials=Credentials.insecure_bearer({world.token(f'peak-{i}')!r}))\n"
            f"for j in range({reports}):\n"
            f"    c.record('m.grr', {LABELS_16!r}[j % 16])\n"
            "r = c.flush(timeout=60)\n"
            "c.close()\n"
            "assert r.acknowledged == " + str(reports) + "\n"
            "heavy = [m for m in " + repr(HEAVY) + " if sys.modules.get(m) is not None]\n"
            "assert not heavy, heavy\n"
            "print(json.dumps({'hwm': _status('VmHWM'), 'rss': _status('VmRSS')}))\n"
        )
        samples.append(_child(code))
    return {
        "peak_rss_bytes": summarize([s["hwm"] for s in samples]),
        "rss_after_bytes": summarize([s["rss"] for s in samples]),
    }


# --- record() latency ----------------------------------------------------------------------


def _values(metric: str, n: int, rng: random.Random) -> list[Any]:
    if metric == "m.num":
        return [rng.uniform(-10, 110) for _ in range(n)]
    labels = LABELS_64 if metric == "m.oue" else LABELS_16
    return [labels[rng.randrange(len(labels))] for _ in range(n)]


def _per_call(fn: Callable[[], None], calls: int, runs: int) -> Timing:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return summarize(samples)


def measure_record(world: World, runs: int, calls: int) -> dict[str, dict[str, Timing]]:
    out: dict[str, dict[str, Timing]] = {}
    rng = random.Random(1)
    with world.client(world.tmp / "latency", max_outbox=10_000_000) as client:
        by_metric = {p.metric_name: p for p in client.policies()}
        for metric, label in (
            ("m.grr", "GRR k=16"),
            ("m.oue", "OUE k=64"),
            ("m.memo", "RAPPOR-GRR k=16 (memoized)"),
            ("m.num", "Piecewise [0,100]"),
        ):
            values = _values(metric, calls * runs, rng)
            it = iter(values)

            def one(metric: str = metric, it: Any = it) -> None:
                client.record(metric, next(it))

            record_t = _per_call(one, calls, runs)
            policy = by_metric[metric]
            mech_inputs = [policy.label_index(v) if policy.labels else float(v) for v in values]
            it2 = iter(mech_inputs)
            mech: Any = policy.mechanism
            # A memoized mechanism needs its memo state (one per user and metric).
            extra: dict[str, Any] = {"memo": mech.new_memo()} if metric == "m.memo" else {}

            def perturb(it2: Any = it2, mech: Any = mech, extra: Any = extra) -> None:
                mech.perturb(next(it2), **extra)

            out[label] = {"record_s": record_t, "perturb_s": _per_call(perturb, calls, runs)}
    out["SQLite INSERT+COMMIT, WAL, synchronous=FULL (reference)"] = {
        "commit_s": _sqlite_floor(world.tmp / "floor.db", calls, runs)
    }
    return out


def measure_fresh_install(world: World, runs: int, devices: int) -> dict[str, Timing]:
    """CPU of the device's own thread per fresh install, as `fedldp demo` simulates it.

    Timed per install: `Client()` on a new state folder (state file created,
    trust root verified, the 4 policies fetched and verified), one `record()`,
    `flush()` (one Submit), `close()`, and removing the folder. All devices share
    one gRPC channel (`Client(channel=...)`), as in the demo. CPU is
    `time.thread_time()` of the calling thread, so the in-process collector's
    threads are not counted (nor gRPC's own polling thread). Reference, same
    run, same thread clock: the two gRPC calls alone (GetPolicies, and Submit of
    one stored report) on the same channel.
    """
    import shutil

    import grpc
    from fedldp.client.sdk import Client, TrustRoot
    from fedldp.client.transport import Credentials, Transport

    trust_root = TrustRoot(world.authority.root_envelope, world.authority.root_public_keys)
    channel = grpc.insecure_channel(world.collector.address)
    cpu: list[float] = []
    wall: list[float] = []
    floor: list[float] = []
    try:
        for run in range(runs):
            tokens = [
                Credentials.insecure_bearer(world.token(f"fresh-{run}-{i}")) for i in range(devices)
            ]
            folders = [world.tmp / f"fresh-{run}-{i}" for i in range(devices)]
            start_cpu, start_wall = time.thread_time(), time.perf_counter()
            for token, folder in zip(tokens, folders, strict=True):
                with Client(
                    world.collector.address,
                    trust_root=trust_root,
                    state_dir=folder,
                    credentials=token,
                    channel=channel,
                ) as client:
                    client.record("m.grr", LABELS_16[0])
                    client.flush()
                shutil.rmtree(folder)
            cpu.append((time.thread_time() - start_cpu) / devices)
            wall.append((time.perf_counter() - start_wall) / devices)
        transport = Transport(
            world.collector.address,
            Credentials.insecure_bearer(world.token("fresh-floor")),
            channel=channel,
        )
        with world.client(world.tmp / "fresh-floor") as client:
            client.record("m.grr", LABELS_16[0])
            stored = client._outbox.entries()[0].report
        for _ in range(runs):
            start_cpu = time.thread_time()
            for _ in range(devices):
                transport.get_policies()
                transport.submit_raw([stored])
            floor.append((time.thread_time() - start_cpu) / devices)
    finally:
        channel.close()
    return {
        "cpu_s_per_install": summarize(cpu),
        "wall_s_per_install": summarize(wall),
        "grpc_pair_cpu_s (reference)": summarize(floor),
    }


# --- device CPU, collector in another process ----------------------------------------------


def _serve_world(conn: Any, subjects: int) -> None:
    """Child process: a `World` (the collector and its policies); sends what a device needs.

    Sends (address, root envelope bytes, root public keys, `subjects` tokens,
    trust folder), then serves until the parent sends anything.
    """
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-sdk-world-") as tmp:
        world = World(Path(tmp))
        try:
            a = world.authority
            conn.send(
                (
                    world.collector.address,
                    a.root_envelope.SerializeToString(),
                    [k.public_bytes_raw() for k in a.root_public_keys],
                    [world.token(f"cpu-{i}") for i in range(subjects)],
                    str(world.trust_dir),
                )
            )
            conn.recv()
        finally:
            world.close()


def _fresh_installs(
    address: str, trust_root: Any, tokens: list[str], channel: Any, folder: Path
) -> dict[str, list[float]]:
    """Process CPU per fresh install and per phase (Client(), record, flush, close+rmtree)."""
    import shutil

    from fedldp.client.sdk import Client
    from fedldp.client.transport import Credentials

    phases: dict[str, list[float]] = {"total": [], "init": [], "record": [], "flush": []}
    for i, token in enumerate(tokens):
        state = folder / f"d{i}"
        t0 = time.process_time()
        client = Client(
            address,
            trust_root=trust_root,
            state_dir=state,
            credentials=Credentials.insecure_bearer(token),
            channel=channel,
        )
        t1 = time.process_time()
        client.record("m.grr", LABELS_16[i % 16])
        t2 = time.process_time()
        client.flush()
        t3 = time.process_time()
        client.close()
        shutil.rmtree(state)
        t4 = time.process_time()
        for name, value in (
            ("total", t4 - t0),
            ("init", t1 - t0),
            ("record", t2 - t1),
            ("flush", t3 - t2),
        ):
            phases[name].append(value)
    return phases


def measure_device_cpu(runs: int, devices: int, records: int) -> dict[str, Timing]:
    """Process CPU of the device side, the collector in another process (as in the demo).

    * **Fresh install** (`fedldp demo`'s simulated device): `Client()` on a new
      state folder (on /dev/shm when there is one, as the demo does), one
      `record()`, `flush()`, `close()`, removing the folder; every device on
      one shared channel and given the same verified `TrustStore` (each
      Client copies it), as in the demo. `time.process_time()` of this process, so gRPC's own
      threads count; the collector's do not. Median over `runs` runs of the
      mean per device, and per phase.
    * **Steady state**: one long-lived `Client` (state on disk, its own
      channel) records `records` values (GRR k=16) and flushes them (100 per
      call): process CPU per record, the record and its share of the flushes.
    * References, same clock: one GetPolicies and one Submit of one stored
      report on the shared channel (the two calls a fresh install makes); a
      bare durable SQLite INSERT+COMMIT (WAL, synchronous=FULL) on the steady
      state's disk (the floor under a durable record()).
    """
    import multiprocessing
    import statistics

    import grpc
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from fedldp.client.sdk import Client, TrustRoot
    from fedldp.client.transport import Credentials, Transport
    from fedldp.v1 import policy_pb2

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve_world, args=(child, runs * devices + 2))
    server.start()
    address, root, keys, tokens, trust_dir = parent.recv()
    # As the demo does: the pinned root verified once, each Client copies the store.
    trust_root = TrustRoot(
        policy_pb2.SignedEnvelope.FromString(root),
        [Ed25519PublicKey.from_public_bytes(k) for k in keys],
    ).trust_store(now=int(time.time()))
    channel = grpc.insecure_channel(address)
    shm = Path("/dev/shm")
    out: dict[str, list[float]] = {}
    try:
        with (
            tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as fresh,
            tempfile.TemporaryDirectory() as disk,
        ):
            warm = _fresh_installs(address, trust_root, tokens[-2:], channel, Path(fresh))
            del warm
            for run in range(runs):
                batch = tokens[run * devices : (run + 1) * devices]
                phases = _fresh_installs(address, trust_root, batch, channel, Path(fresh))
                for name, values in phases.items():
                    out.setdefault(f"fresh_install_{name}_cpu_s", []).append(
                        statistics.fmean(values)
                    )
            with Client(
                address,
                trust_root=trust_dir,
                state_dir=Path(disk) / "steady",
                credentials=Credentials.insecure_bearer(tokens[-1]),
                max_outbox=10 * records,
            ) as client:
                client.record("m.grr", LABELS_16[0])
                client.flush()
                for _ in range(runs):
                    t0 = time.process_time()
                    for i in range(records):
                        client.record("m.grr", LABELS_16[i % 16])
                    t1 = time.process_time()
                    assert client.flush().acknowledged == records
                    t2 = time.process_time()
                    out.setdefault("steady_record_cpu_s", []).append((t1 - t0) / records)
                    out.setdefault("steady_flush_share_cpu_s", []).append((t2 - t1) / records)
                    out.setdefault("steady_total_cpu_s", []).append((t2 - t0) / records)
                stored = client._outbox  # for the reference's one stored report
                client.record("m.grr", LABELS_16[0])
                report = stored.entries()[0].report
            out["sqlite_commit_cpu_s (reference)"] = _sqlite_commit_cpu(
                Path(disk) / "floor.db", records, runs
            )
            transport = Transport(address, Credentials.insecure_bearer(tokens[0]), channel=channel)
            for _ in range(runs):
                t0 = time.process_time()
                for _ in range(devices):
                    transport.get_policies()
                    transport.submit_raw([report])
                out.setdefault("grpc_pair_cpu_s (reference)", []).append(
                    (time.process_time() - t0) / devices
                )
    finally:
        channel.close()
        parent.send("stop")
        server.join()
    return {name: summarize(values) for name, values in out.items()}


def _sqlite_commit_cpu(path: Path, calls: int, runs: int) -> list[float]:
    """Process CPU per bare durable INSERT+COMMIT (WAL, synchronous=FULL), per run."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id BLOB PRIMARY KEY, body BLOB)")
    body = os.urandom(72)
    samples = []
    try:
        for _ in range(runs):
            start = time.process_time()
            for _ in range(calls):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t VALUES (?, ?)", (os.urandom(16), body))
                conn.execute("COMMIT")
            samples.append((time.process_time() - start) / calls)
    finally:
        conn.close()
    return samples


def _sqlite_floor(path: Path, calls: int, runs: int) -> Timing:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id BLOB PRIMARY KEY, body BLOB)")
    body = os.urandom(60)

    def one() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (os.urandom(16), body))
        conn.execute("COMMIT")

    try:
        return _per_call(one, calls, runs)
    finally:
        conn.close()


# --- outbox throughput and state size ------------------------------------------------------


def measure_outbox(world: World, runs: int, pending: int) -> dict[str, Timing]:
    from fedldp.client.outbox import Outbox
    from fedldp.client.transport import Credentials, Transport

    rng = random.Random(2)
    enqueue, drain, raw = [], [], []
    hand: list[float] = []
    generated: list[float] = []
    for i in range(runs):
        with world.client(
            world.tmp / f"outbox-{i}", subject=f"outbox-{i}", max_outbox=pending + 1, batch_size=100
        ) as client:
            values = _values("m.grr", pending, rng)
            start = time.perf_counter()
            for v in values:
                client.record("m.grr", v)
            enqueue.append(pending / (time.perf_counter() - start))
            stored = [e.report for e in Outbox(client._store).entries()]
            start = time.perf_counter()
            result = client.flush(timeout=300)
            drain.append(pending / (time.perf_counter() - start))
            assert result.acknowledged == pending, result
        batches = [stored[j : j + 100] for j in range(0, len(stored), 100)]
        hand.append(_encode_s_per_batch(_hand_encoding(), batches))
        generated.append(_encode_s_per_batch(_generated_encoding, batches))
        # Reference: the same bytes, straight to the collector (another subject, so
        # they are new reports there too), no outbox bookkeeping.
        transport = Transport(
            world.collector.address, Credentials.insecure_bearer(world.token(f"raw-{i}"))
        )
        fresh = [_new_id(r) for r in stored]
        start = time.perf_counter()
        for j in range(0, len(fresh), 100):
            transport.submit_raw(fresh[j : j + 100])
        raw.append(pending / (time.perf_counter() - start))
        transport.close()
    return {
        "enqueue_reports_per_s": summarize(enqueue),
        "drain_reports_per_s": summarize(drain),
        "raw_submit_reports_per_s (reference)": summarize(raw),
        "submit_encoding_hand_s_per_100": summarize(hand),
        "submit_encoding_generated_s_per_100": summarize(generated),
    }


def _hand_encoding() -> Callable[[list[bytes]], bytes]:
    from fedldp.client.transport import submit_request_bytes

    return submit_request_bytes


def _generated_encoding(batch: list[bytes]) -> bytes:
    """The SubmitRequest built by the generated code: each stored report parsed, then
    the request serialized (what the SDK would do without `submit_request_bytes`)."""
    from fedldp.v1 import collector_pb2

    request = collector_pb2.SubmitRequest()
    for report in batch:
        request.reports.add().MergeFromString(report)
    return request.SerializeToString()


def _encode_s_per_batch(
    encode: Callable[[list[bytes]], bytes], batches: list[list[bytes]]
) -> float:
    """Seconds per batch to encode every batch (the bytes are checked against the hand path)."""
    from fedldp.client.transport import submit_request_bytes

    assert all(encode(b) == submit_request_bytes(b) for b in batches)
    start = time.perf_counter()
    for _ in range(5):
        for batch in batches:
            encode(batch)
    return (time.perf_counter() - start) / (5 * len(batches))


def _new_id(report_bytes: bytes) -> bytes:
    from fedldp.v1 import collector_pb2

    report = collector_pb2.Report.FromString(report_bytes)
    report.report_id = secrets.token_bytes(16)
    return report.SerializeToString()


def _state_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.glob("fedldp-device.sqlite3*"))


def measure_state_size(world: World, runs: int) -> dict[str, dict[str, Timing]]:
    """The state file's growth per 1,000 pending reports, through the public API only.

    A client records nothing and is closed (one file left: `close()`
    checkpoints the log); a second one records 1,000 reports and is closed;
    the file's growth is the figure.
    """
    from fedldp.client.device_store import STATE_FILE_NAME

    out: dict[str, dict[str, Timing]] = {}
    rng = random.Random(3)
    for metric, label in (("m.grr", "GRR k=16"), ("m.oue", "OUE k=64")):
        per_k, payload = [], []
        for i in range(runs):
            state = world.tmp / f"size-{metric}-{i}"
            world.client(state, max_outbox=2000).close()
            empty = (state / STATE_FILE_NAME).stat().st_size
            with world.client(state, max_outbox=2000, fetch_policies=False) as client:
                for v in _values(metric, 1000, rng):
                    client.record(metric, v)
                # The reference reads the stored bytes (not part of the measured figure).
                payload.append(sum(len(e.report) for e in client._outbox.entries()))
            per_k.append((state / STATE_FILE_NAME).stat().st_size - empty)
        out[label] = {
            "state_bytes_per_1000": summarize(per_k),
            "report_bytes_per_1000 (reference)": summarize(payload),
        }
    return out


# --- outages and the state footprint (--outage) ------------------------------------------


class SubmitLog:
    """Every `Transport.submit_raw` call of this process: (monotonic start, ok, reports).

    The SDK's own Submit attempts, counted where they leave the device (whether
    or not a collector is listening), by wrapping the class method for the
    duration of a measurement.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[float, bool, int]] = []

    def __enter__(self) -> SubmitLog:
        from fedldp.client.transport import Transport

        original = Transport.submit_raw
        log = self.calls

        def counting(transport: Any, reports: Any) -> Any:
            started = time.monotonic()
            try:
                response = original(transport, reports)
            except Exception:
                log.append((started, False, len(reports)))
                raise
            log.append((started, True, len(reports)))
            return response

        self._original = original
        Transport.submit_raw = counting  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from fedldp.client.transport import Transport

        Transport.submit_raw = self._original  # type: ignore[method-assign]

    def between(self, start: float, end: float) -> tuple[int, int, int]:
        """(calls, failed calls, reports acknowledged) of calls started in [start, end)."""
        inside = [c for c in self.calls if start <= c[0] < end]
        return len(inside), sum(not ok for _, ok, _ in inside), sum(n for _, ok, n in inside if ok)


def measure_outage(
    world: World, outage_s: float, after_s: float, backlog: int, interval_s: float
) -> dict[str, Any]:
    """A device with a backlog rides out an outage of `outage_s`, then `after_s` of service.

    The device: `Client(background=True, send_interval_seconds=interval_s)`,
    default `Backoff`, batches of 100. Its collector (the real one, own ledger
    file) is stopped at t=0; at t=0 the app records `backlog` reports, then one
    more every second for the whole run. At t=`outage_s` the collector is
    restarted on the same port and the app calls `client.wake()` (its
    connectivity hook). Counted: the SDK's Submit calls (`SubmitLog`) and the
    reports acknowledged, per phase and per minute, and how long after the
    wake() every report recorded before it was acknowledged.
    """
    state = world.tmp / f"outage-{secrets.token_hex(4)}"
    collector = world.start_collector(state.name)
    port = collector.port
    recorded: list[float] = []
    with SubmitLog() as log:
        client = world.client(
            state,
            subject=state.name,
            target=collector.address,
            background=True,
            send_interval_seconds=interval_s,
            max_outbox=backlog + 1000,
        )
        try:
            collector.stop(grace=0.0)
            start = time.monotonic()
            for label in _values("m.grr", backlog, random.Random(5)):
                client.record("m.grr", label)
                recorded.append(time.monotonic())
            restart = start + outage_s
            end = restart + after_s
            next_record = start + 1.0
            woke = None
            while True:
                now = time.monotonic()
                if woke is None and now >= restart:
                    collector = world.start_collector(state.name, listen=f"127.0.0.1:{port}")
                    woke = time.monotonic()
                    client.wake()  # the app's connectivity hook
                if now >= end:
                    break
                if now >= next_record:
                    client.record("m.grr", LABELS_16[len(recorded) % 16])
                    recorded.append(time.monotonic())
                    next_record += 1.0
                    continue
                time.sleep(max(0.0, min(next_record, restart if woke is None else end) - now))
            pending_at_end = client.pending()
        finally:
            client.close()
            collector.stop(grace=1.0)
    assert woke is not None
    before_wake = sum(t < woke for t in recorded)
    delivered, delivered_at = 0, None
    for started, ok, n in log.calls:
        delivered += n if ok else 0
        if delivered_at is None and delivered >= before_wake:
            delivered_at = started
    phases = {"outage": (start, woke), "after": (woke, woke + after_s)}
    out: dict[str, Any] = {"backlog": backlog, "recorded": len(recorded)}
    for name, (a, b) in phases.items():
        calls, failed, acked = log.between(a, b)
        per_minute = 60.0 / (b - a)
        out[name] = {
            "seconds": b - a,
            "submit_calls": calls,
            "failed_calls": failed,
            "reports_acknowledged": acked,
            "submit_calls_per_min": calls * per_minute,
            "reports_acknowledged_per_min": acked * per_minute,
        }
    out["backlog_delivered_s_after_wake"] = (
        None if delivered_at is None else max(0.0, delivered_at - woke)
    )
    out["pending_at_end"] = pending_at_end
    return out


def _dir_bytes(state: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(state.iterdir()) if p.is_file()}


def measure_state_files(world: World, sizes: list[int]) -> dict[str, Any]:
    """Files in the state folder, measured from the outside (the app's view).

    Public API only: `Client(...)`, `record()`, `flush()`, `close()`; the folder
    is listed with `os.stat` while the client is open. Idle: a client that
    recorded and flushed 200 reports (everything acknowledged). Pending: N
    reports recorded and not sent. Closed: after `close()`.
    """
    out: dict[str, Any] = {}
    state = world.tmp / "files-idle"
    with world.client(state, subject="files-idle") as client:
        for label in _values("m.grr", 200, random.Random(6)):
            client.record("m.grr", label)
        client.flush(timeout=60)
        out["idle (200 recorded, all sent)"] = _dir_bytes(state)
    out["idle, after close()"] = _dir_bytes(state)
    for n in sizes:
        state = world.tmp / f"files-{n}"
        with world.client(state, subject=f"files-{n}", max_outbox=n + 1) as client:
            for label in _values("m.grr", n, random.Random(7)):
                client.record("m.grr", label)
            out[f"{n:,} pending"] = _dir_bytes(state)
        out[f"{n:,} pending, after close()"] = _dir_bytes(state)
    return out


def _print_outage(figures: dict[str, Any]) -> None:
    o = figures["outage"]
    rows = []
    for phase in ("outage", "after"):
        f = o[phase]
        rows.append(
            [
                f"{phase} ({f['seconds']:.0f} s)",
                f"{f['submit_calls']} ({f['failed_calls']} failed)",
                f"{f['submit_calls_per_min']:.1f}",
                f"{f['reports_acknowledged']}",
                f"{f['reports_acknowledged_per_min']:.0f}",
            ]
        )
    print(
        f"Outage: backlog {o['backlog']} reports + 1 record/s, {o['recorded']} recorded; "
        f"backlog delivered {fmt_float(o['backlog_delivered_s_after_wake'])} s after wake(); "
        f"pending at the end {o['pending_at_end']}"
    )
    print(format_table(["phase", "Submit calls", "calls/min", "acknowledged", "reports/min"], rows))
    print()
    rows = [
        [
            name,
            ", ".join(
                f"{k.replace('fedldp-device.sqlite3', 'db')}: {v / 1024:.0f} KiB"
                for k, v in files.items()
            )
            or "(none)",
            f"{sum(files.values()) / 1024:.0f}",
        ]
        for name, files in figures["state_files"].items()
    ]
    print("State folder on disk (files and sizes, KiB)")
    print(format_table(["state", "files", "total KiB"], rows))


def outage_main(args: argparse.Namespace) -> int:
    outage_s, after_s = (15.0, 15.0) if args.quick else (60.0, 60.0)
    sizes = [1000] if args.quick else [1000, 10_000]
    params = {
        "outage_s": outage_s,
        "after_s": after_s,
        "backlog": 1000,
        "send_interval_s": 5.0,
        "state_sizes": sizes,
        "quick": args.quick,
    }
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-sdk-") as tmp:
        world = World(Path(tmp))
        try:
            figures = {
                "outage": measure_outage(world, outage_s, after_s, 1000, 5.0),
                "state_files": measure_state_files(world, sizes),
            }
        finally:
            world.close()
    _print_outage(figures)
    if args.json:
        write_json(
            args.json, benchmark="sdk-outage", params=params, figures=figures, packages=PACKAGES
        )
    return 0


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sdk",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (< 1 minute)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per figure (>= 5)")
    parser.add_argument(
        "--outage",
        action="store_true",
        help="only the outage run and the state folder sizes (--quick: 15 s + 15 s, < 1 minute)",
    )
    parser.add_argument(
        "--device-cpu",
        action="store_true",
        help="only the device CPU figures (fresh install, steady state; --quick < 1 minute)",
    )
    args = parser.parse_args(argv)
    if args.outage:
        return outage_main(args)
    if args.device_cpu:
        return device_cpu_main(args)
    runs = max(5, args.runs or 5)
    calls = 30 if args.quick else 500
    pending = 200 if args.quick else 3000
    installs = 50 if args.quick else 500
    params = {
        "fresh_installs_per_run": installs,
        "runs": runs,
        "record_calls_per_run": calls,
        "outbox_pending": pending,
        "quick": args.quick,
    }
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-sdk-") as tmp:
        world = World(Path(tmp))
        try:
            figures: dict[str, Any] = {
                "imports": measure_imports(runs),
                "device_peak": measure_device_peak(world, runs, 200),
                "record": measure_record(world, runs, calls),
                "outbox": measure_outbox(world, runs, pending),
                "state_size": measure_state_size(world, runs),
                "fresh_install": measure_fresh_install(world, runs, installs),
            }
        finally:
            world.close()
    figures["device_cpu"] = measure_device_cpu(runs, installs, calls * 2)
    _print(figures)
    if args.json:
        write_json(args.json, benchmark="sdk", params=params, figures=figures, packages=PACKAGES)
    return 0


def device_cpu_main(args: argparse.Namespace) -> int:
    """`--device-cpu`: only `measure_device_cpu` (fresh installs and the steady state)."""
    runs = max(5, args.runs or 5)
    devices = 100 if args.quick else 500
    records = 300 if args.quick else 2000
    figures = {"device_cpu": measure_device_cpu(runs, devices, records)}
    _print_device_cpu(figures["device_cpu"])
    if args.json:
        params = {"runs": runs, "devices_per_run": devices, "records_per_run": records}
        write_json(args.json, benchmark="sdk", params=params, figures=figures, packages=PACKAGES)
    return 0


def _print_device_cpu(f: dict[str, Timing]) -> None:
    ref = f["grpc_pair_cpu_s (reference)"]
    rows = [
        [label, _mmm(f[key], 1000), f"{f[key].median / ref.median:.2f}"]
        for label, key in (
            ("fresh install, all (as in fedldp demo)", "fresh_install_total_cpu_s"),
            ("  Client() (state file, policy fetch + verify)", "fresh_install_init_cpu_s"),
            ("  record()", "fresh_install_record_cpu_s"),
            ("  flush() (one Submit)", "fresh_install_flush_cpu_s"),
            ("steady state: record() + its share of flush()", "steady_total_cpu_s"),
            ("  record() alone", "steady_record_cpu_s"),
            ("  flush() share (100 per call)", "steady_flush_share_cpu_s"),
        )
    ]
    rows.append(["GetPolicies + Submit alone (reference)", _mmm(ref, 1000), "1.00"])
    floor = f["sqlite_commit_cpu_s (reference)"]
    rows.append(
        [
            "bare durable SQLite INSERT+COMMIT, same disk (reference)",
            _mmm(floor, 1000),
            f"{floor.median / ref.median:.2f}",
        ]
    )
    print("Device CPU (process, collector in another process), ms (median [min-max])")
    print(format_table(["what", "CPU ms", "÷ gRPC pair"], rows))


def _mmm(t: Timing, scale: float = 1.0, digits: int = 3) -> str:
    return (
        f"{fmt_float(t.median * scale, digits)} "
        f"[{fmt_float(t.min * scale, digits)}-{fmt_float(t.max * scale, digits)}]"
    )


def _print(figures: dict[str, Any]) -> None:
    mib = 1 / (1024 * 1024)
    rows = [
        [name, _mmm(f["import_s"], 1000), _mmm(f["rss_bytes"], mib)]
        for name, f in figures["imports"].items()
    ]
    peak = figures["device_peak"]
    rows.append(["Client: 200 records + flush (peak)", "-", _mmm(peak["peak_rss_bytes"], mib)])
    print("Import time and resident memory, numpy & co. blocked (median [min-max])")
    print(format_table(["what", "import ms", "RSS MiB"], rows))
    print()
    rows = []
    floor = figures["record"].get("SQLite INSERT+COMMIT, WAL, synchronous=FULL (reference)")
    for name, f in figures["record"].items():
        if "record_s" in f:
            rows.append(
                [
                    name,
                    _mmm(f["record_s"], 1e6),
                    _mmm(f["perturb_s"], 1e6),
                    f"{f['record_s'].median / floor['commit_s'].median:.2f}",
                ]
            )
    rows.append(["SQLite commit alone (reference)", _mmm(floor["commit_s"], 1e6), "-", "1.00"])
    print("record() latency per call, µs (median [min-max])")
    print(format_table(["policy", "record()", "perturb() alone", "÷ SQLite commit"], rows))
    print()
    o = figures["outbox"]
    ref = o["raw_submit_reports_per_s (reference)"]
    rows = [
        ["enqueue (record loop)", fmt_rate(o["enqueue_reports_per_s"].median), "-"],
        [
            "drain (flush to collector)",
            fmt_rate(o["drain_reports_per_s"].median),
            f"{o['drain_reports_per_s'].median / ref.median:.2f}",
        ],
        ["raw submit, same bytes (reference)", fmt_rate(ref.median), "1.00"],
    ]
    print("Outbox throughput, reports/s (median)")
    print(format_table(["path", "reports/s", "÷ raw submit"], rows))
    print()
    batch_s = 100 / o["drain_reports_per_s"].median
    rows = [
        [
            name,
            _mmm(o[key], 1e6),
            f"{o[key].median / batch_s * 100:.2f} %",
        ]
        for name, key in (
            ("hand (submit_request_bytes)", "submit_encoding_hand_s_per_100"),
            ("generated (parse + SerializeToString)", "submit_encoding_generated_s_per_100"),
        )
    ]
    print(
        f"SubmitRequest encoding per 100-report batch, µs (median [min-max]); "
        f"a drained batch takes {batch_s * 1e3:.2f} ms"
    )
    print(format_table(["encoding", "µs per batch", "share of a drained batch"], rows))
    print()
    rows = [
        [
            name,
            _mmm(f["state_bytes_per_1000"], 1 / 1024),
            _mmm(f["report_bytes_per_1000 (reference)"], 1 / 1024),
        ]
        for name, f in figures["state_size"].items()
    ]
    print("On-disk state per 1,000 pending reports, KiB (median [min-max])")
    print(format_table(["policy", "state file growth", "report bytes (reference)"], rows))
    print()
    f = figures["fresh_install"]
    ref = f["grpc_pair_cpu_s (reference)"]
    rows = [
        [
            "fresh install: Client() + record + flush + close",
            _mmm(f["cpu_s_per_install"], 1000),
            _mmm(f["wall_s_per_install"], 1000),
            f"{f['cpu_s_per_install'].median / ref.median:.2f}",
        ],
        ["GetPolicies + Submit alone (reference)", _mmm(ref, 1000), "-", "1.00"],
    ]
    print("Fresh install (as in fedldp demo), ms per device, device thread CPU (median [min-max])")
    print(format_table(["what", "CPU ms", "wall ms", "÷ gRPC pair"], rows))
    print()
    _print_device_cpu(figures["device_cpu"])


if __name__ == "__main__":
    raise SystemExit(main())
