"""The collector test kit: a throwaway deployment, wire reports, processes, PostgreSQL.

Internal to this repository (tests and bench/; not shipped in the `fedldp`
package, and not a public API): tests import it as `collector_testkit`
(pyproject's pytest ``pythonpath``), benchmarks as `tests.support.collector_testkit`
(run from the repository root).

`Deployment.create(now=...)` makes an `Authority` (root + policy key), signs a
set of policies, holds a token secret, and can write the trust and policy
folders a `fedldp collector serve` process reads. `make_report` builds a wire
report for a verified policy and a mechanism output. Nothing here is for
production keys.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import itertools
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from fedldp.authoring import Authority, write_envelope, write_public_key
from fedldp.client.mechanisms.base import BitVectorOutput, CategoryOutput, Output
from fedldp.client.policy import TrustStore, VerifiedPolicy, verify_policy
from fedldp.collector.auth import TokenAuthority
from fedldp.collector.config import CollectorConfig
from fedldp.collector.ledger import CheckedReport
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.wire import payload_fields
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import policy_pb2

COARSE = 3600


def _metric_name(policy_id: str) -> str:
    return "metric." + re.sub(r"[^A-Za-z0-9_]", "_", policy_id)


@dataclass
class Deployment:
    """An authority, its signed policies, and a token secret."""

    now: int
    authority: Authority
    envelopes: list[policy_pb2.SignedEnvelope] = field(default_factory=list)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    audience: str = "default"

    @classmethod
    def create(cls, *, now: int) -> Deployment:
        """Fresh keys valid from an hour before `now` (so policies are active at `now`)."""
        return cls(now, Authority.generate(now=now - 3600))

    def add_categorical(
        self,
        policy_id: str,
        *,
        labels: Sequence[str] = ("a", "b", "c", "d"),
        epsilon: str = "0.5",
        epsilon_cap: str = "2",
        window_seconds: int = 86400,
        mechanism: str = "grr",
        version: int = 1,
        not_before: int | None = None,
        lifetime_seconds: int = 30 * 86400,
        params: dict[str, str] | None = None,
        memo_charging: int = policy_pb2.MEMO_CHARGING_NONE,
        metric: str | None = None,
        analyzer_key: bytes | None = None,
        min_batch: int = 2,
    ) -> policy_pb2.SignedEnvelope:
        """Sign and keep a categorical policy; returns its envelope. The metric name
        is derived from `policy_id` unless `metric` is given; `analyzer_key` (raw X25519)
        makes it a shuffle-model policy with that `min_batch` (docs/shuffle.md)."""
        policy = self.authority.categorical_policy(
            policy_id=policy_id,
            metric=_metric_name(policy_id) if metric is None else metric,
            labels=list(labels),
            epsilon=epsilon,
            epsilon_cap=epsilon_cap,
            window_seconds=window_seconds,
            now=self.now - 60 if not_before is None else not_before,
            mechanism=mechanism,
            version=version,
            lifetime_seconds=lifetime_seconds,
            min_reports=1,
            audience=(self.audience,),
            params=params,
            memo_charging=memo_charging,  # type: ignore[arg-type]
        )
        if analyzer_key is not None:
            policy.shuffle.analyzer_public_key = analyzer_key
            policy.shuffle.min_batch = min_batch
        env = self.authority.sign(policy)
        self.envelopes.append(env)
        return env

    def add_numeric(
        self,
        policy_id: str,
        *,
        lo: str = "0",
        hi: str = "1",
        epsilon: str = "1",
        epsilon_cap: str = "4",
        mechanism: str = "piecewise",
        window_seconds: int = 86400,
        params: dict[str, str] | None = None,
    ) -> policy_pb2.SignedEnvelope:
        """Sign and keep a numeric policy; returns its envelope."""
        policy = self.authority.numeric_policy(
            params=params or {},
            policy_id=policy_id,
            metric=_metric_name(policy_id),
            lo=lo,
            hi=hi,
            epsilon=epsilon,
            epsilon_cap=epsilon_cap,
            window_seconds=window_seconds,
            now=self.now - 60,
            mechanism=mechanism,
            min_reports=1,
            audience=(self.audience,),
        )
        env = self.authority.sign(policy)
        self.envelopes.append(env)
        return env

    def add_multi(
        self,
        policy_id: str,
        *,
        attributes: Sequence[Mapping[str, Any]],
        mechanism: str = "multi-split",
        epsilon: str = "1",
        epsilon_cap: str = "4",
        window_seconds: int = 86400,
    ) -> policy_pb2.SignedEnvelope:
        """Sign and keep a multi-attribute policy ([[metric.attributes]] tables)."""
        policy = self.authority.multi_policy(
            policy_id=policy_id,
            metric=_metric_name(policy_id),
            attributes=attributes,
            mechanism=mechanism,
            epsilon=epsilon,
            epsilon_cap=epsilon_cap,
            window_seconds=window_seconds,
            now=self.now - 60,
            min_reports=1,
            audience=(self.audience,),
        )
        env = self.authority.sign(policy)
        self.envelopes.append(env)
        return env

    def add_open(
        self,
        policy_id: str,
        *,
        max_bytes: int = 4,
        epsilon: str = "4",
        epsilon_cap: str = "4",
        mechanism: str = "pem",
        window_seconds: int = 86400,
        params: dict[str, str] | None = None,
        metric: str | None = None,
    ) -> policy_pb2.SignedEnvelope:
        """Sign and keep an open-domain (string) policy of `mechanism` (pem, cms or
        hcms; `params` as the policy states them); returns its envelope."""
        policy = self.authority.open_policy(
            policy_id=policy_id,
            metric=_metric_name(policy_id) if metric is None else metric,
            max_bytes=max_bytes,
            epsilon=epsilon,
            epsilon_cap=epsilon_cap,
            window_seconds=window_seconds,
            now=self.now - 60,
            mechanism=mechanism,
            min_reports=1,
            audience=(self.audience,),
            params=params,
        )
        env = self.authority.sign(policy)
        self.envelopes.append(env)
        return env

    def trust(self) -> TrustStore:
        """The collector's trust store (pinned to the authority's root key)."""
        return self.authority.trust_store(now=self.now)

    def verified(
        self, envelope: policy_pb2.SignedEnvelope, *, now: int | None = None
    ) -> VerifiedPolicy:
        """`envelope` verified at `now` (default: the deployment's now)."""
        return verify_policy(
            envelope, self.trust(), now=self.now if now is None else now, audience=self.audience
        )

    def registry(self, *, now: int | None = None) -> PolicyRegistry:
        """A registry of every policy signed so far."""
        return PolicyRegistry.from_envelopes(
            self.envelopes,
            self.trust(),
            now=self.now if now is None else now,
            audience=self.audience,
        )

    def token(self, subject: str, *, ttl: int = 86400) -> str:
        """A bearer token for `subject`, valid for `ttl` seconds after `now`."""
        return TokenAuthority(self.secret).mint(subject, expires_at=self.now + ttl)

    def write_folders(self, base: Path) -> tuple[Path, Path]:
        """Write trust/ (pinned key + root) and policies/ under `base`; returns both."""
        trust_dir, policy_dir = base / "trust", base / "policies"
        (trust_dir / "pinned").mkdir(parents=True, exist_ok=True)
        policy_dir.mkdir(parents=True, exist_ok=True)
        for i, key in enumerate(self.authority.root_public_keys):
            path = trust_dir / "pinned" / f"root{i}.pem"
            if not path.exists():
                write_public_key(key, path)
        write_envelope(self.authority.root_envelope, trust_dir / "1.root")
        for i, env in enumerate(self.envelopes):
            write_envelope(env, policy_dir / f"p{i}.policy")
        return trust_dir, policy_dir

    def config(self, ledger_url: str, **overrides: Any) -> CollectorConfig:
        """A CollectorConfig for an in-process collector on 127.0.0.1:0."""
        values: dict[str, Any] = {
            "ledger_url": ledger_url,
            "token_secret": self.secret.hex(),
            "audience": self.audience,
            "rate_limit_per_second": 100000.0,
            "rate_limit_burst": 100000.0,
            "log_format": "text",
        }
        values.update(overrides)
        return CollectorConfig(**values)


def make_report(
    policy: VerifiedPolicy,
    output: Output,
    *,
    report_id: bytes | None = None,
    coarse_time: int,
    digest: bytes | None = None,
) -> pb.Report:
    """A wire report of `output` under `policy` (random id unless given)."""
    return pb.Report(
        report_id=secrets.token_bytes(16) if report_id is None else report_id,
        policy_id=policy.policy_id,
        policy_version=policy.version,
        policy_digest=policy.digest if digest is None else digest,
        coarse_time=coarse_time,
        **payload_fields(output),
    )


def checked_report(
    policy: VerifiedPolicy, index: int = 1, *, report_id: bytes | None = None
) -> CheckedReport:
    """A report as the service hands it to the ledger: category `index` under
    `policy`, a random id unless given, a content digest that depends on `index`."""
    return CheckedReport(
        secrets.token_bytes(16) if report_id is None else report_id,
        policy,
        CategoryOutput(index),
        hashlib.sha256(b"content" + bytes([index])).digest(),
        0,
    )


def coarse(now: int) -> int:
    """`now` truncated to the hour (a report's coarse_time)."""
    return now - now % COARSE


# --- collector subprocesses (crash tests, multi-process tests, benchmarks) ---


@dataclass
class CollectorProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def write_config(
    deployment: Deployment, base: Path, ledger_url: str, name: str, **settings: object
) -> Path:
    trust_dir, policy_dir = deployment.write_folders(base)
    secret_file = base / "token.secret"
    secret_file.write_text(deployment.secret.hex(), encoding="ascii")
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "ledger_url": ledger_url,
        "trust_dir": str(trust_dir),
        "policy_dir": str(policy_dir),
        "token_secret_file": str(secret_file),
        "audience": deployment.audience,
        "rate_limit_per_second": 100000.0,
        "rate_limit_burst": 100000.0,
        "instance_id": name,
        "log_level": "WARNING",
        "processes": 1,  # tests choose their process count (the default follows the cores)
    }
    values.update(settings)
    values = {k: v for k, v in values.items() if v is not None}  # None: the default
    lines = ["[collector]"]
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value}")
        elif isinstance(value, (list, tuple)):
            lines.append(f"{key} = [{', '.join(f'{v!r}' for v in value)}]")
        else:
            lines.append(f'{key} = "{value}"')
    path = base / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def spawn(
    config: Path, name: str, *, timeout: float = 60.0, cpus: set[int] | None = None
) -> CollectorProcess:
    """Start a collector process and wait until it has bound its port; `cpus`: the
    CPUs it (and every process it starts) may run on, set before it starts, so a
    `processes` left unset follows them (default: this process's)."""
    port_file = config.parent / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log = config.parent / f"{name}.log"
    env = dict(os.environ)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedldp.collector",
            "serve",
            "--config",
            str(config),
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        env=env,
        preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
    )
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"collector exited with {proc.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"collector did not start in {timeout} s: {log.read_text()}")
        time.sleep(0.05)
    return CollectorProcess(proc, int(port_file.read_text()), log)


# --- a throwaway PostgreSQL server (tests and benchmarks) ---


def postgres_bindir() -> Path | None:
    """The folder holding initdb and pg_ctl (pg_config, /usr/local/bin, /usr/lib/postgresql)."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates.append("/usr/local/bin")
    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def memory_folder(min_free_bytes: int = 0) -> str | None:
    """/dev/shm when it is a writable folder with `min_free_bytes` free, else None (the
    default temporary folder): for test data whose fsyncs and deletion should cost
    nothing, where durability is not what the test checks."""
    shm = "/dev/shm"
    try:
        if os.path.isdir(shm) and os.access(shm, os.W_OK):
            return shm if shutil.disk_usage(shm).free >= min_free_bytes else None
    except OSError:
        pass
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_ctl_start(
    runner: list[str], bindir: Path, base: Path, opts: str
) -> subprocess.CompletedProcess[bytes]:
    """pg_ctl start on `base`/data with `opts`, waiting up to 60 s."""
    return subprocess.run(
        [
            *runner,
            str(bindir / "pg_ctl"),
            "-D",
            str(base / "data"),
            "-o",
            opts,
            "-l",
            str(base / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        ],
        capture_output=True,
        check=False,
    )


@dataclass
class PostgresServer:
    """A PostgreSQL server in a temporary folder on a free loopback port.

    Started with the installed initdb/pg_ctl; as the ``postgres`` user when we
    run as root (PostgreSQL refuses to run as root). Superuser ``postgres``,
    trust authentication on 127.0.0.1, fsync on (commits are durable) unless
    started with ``fsync=False`` (the test suite's servers: see tests/conftest.py).
    """

    host: str
    port: int
    base: Path
    bindir: Path
    runner: list[str]
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    opts: str = ""  # the server's options (pg_ctl -o), for `restart`

    @classmethod
    def start(
        cls,
        bindir: Path,
        *,
        max_connections: int = 200,
        fsync: bool = True,
        parent: str | None = None,
    ) -> PostgresServer:
        """initdb + pg_ctl start in a new folder under `parent` (default: the temp folder).

        Raises RuntimeError with the server log on failure.
        """
        runner: list[str] = []
        base = Path(tempfile.mkdtemp(prefix="fedldp-pg-", dir=parent))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")  # KeyError: no user to run the server as
            os.chown(base, pw.pw_uid, pw.pw_gid)
            runner = ["runuser", "-u", "postgres", "--"]
        data = base / "data"
        subprocess.run(
            [
                *runner,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
        )
        # A free port can be taken between free_port() and the server's bind (pytest-xdist
        # workers start their servers at once): try another port when the bind lost.
        for attempt in range(3):
            port = free_port()
            opts = (
                f"-p {port} -k {base} -c listen_addresses=127.0.0.1 "
                f"-c max_connections={max_connections} -c shared_buffers=64MB"
                + ("" if fsync else " -c fsync=off")
            )
            done = _pg_ctl_start(runner, bindir, base, opts)
            if done.returncode == 0:
                return cls("127.0.0.1", port, base, bindir, runner, opts=opts)
            log = (
                (base / "server.log").read_text(errors="replace")
                if (base / "server.log").exists()
                else ""
            )
            if "could not bind" not in log or attempt == 2:
                shutil.rmtree(base, ignore_errors=True)
                raise RuntimeError(f"PostgreSQL did not start: {done.stderr!r} {log}")
        raise AssertionError("unreachable")

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database` on this server."""
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A fresh empty database; returns its URL."""
        import psycopg

        name = f"t{next(self._counter)}"
        with psycopg.connect(
            host=self.host, port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def kill(self) -> None:
        """Stop the server at once (immediate shutdown: like a crash), keeping its data."""
        subprocess.run(
            [
                *self.runner,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.base / "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            check=True,
            capture_output=True,
        )

    def restart(self) -> None:
        """Start the server again on its data and port (after `kill`)."""
        done = _pg_ctl_start(self.runner, self.bindir, self.base, self.opts)
        if done.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not restart: {done.stderr!r}")

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        subprocess.run(
            [
                *self.runner,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.base / "data"),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)


# --- load and attack generation (tests/collector/test_overload.py, bench.collector_memory) ---

SUBMIT_METHOD = "/fedldp.v1.Collector/Submit"
HEALTH_METHOD = "/grpc.health.v1.Health/Check"


def big_bitvector_request(
    deployment: Deployment, policy_id: str, *, now: int, reports: int, bits: int
) -> tuple[bytes, list[int]]:
    """A valid SubmitRequest of `reports` bit-vector reports of `bits` bits each
    under `policy_id` (an OUE policy of `bits` labels in `deployment`), and the
    offset of each report id in its bytes (to give every copy fresh ids)."""
    envelope = next(
        e
        for e in deployment.envelopes
        if policy_pb2.Policy.FromString(e.payload).policy_id == policy_id
    )
    policy = deployment.verified(envelope)
    ids = [secrets.token_bytes(16) for _ in range(reports)]
    message = pb.SubmitRequest(
        reports=[
            make_report(
                policy,
                BitVectorOutput(bytes((bits + 7) // 8), bits),
                report_id=rid,
                coarse_time=coarse(now),
            )
            for rid in ids
        ]
    )
    blob = message.SerializeToString()
    return blob, [blob.index(rid) for rid in ids]


def with_fresh_ids(blob: bytes, offsets: Sequence[int]) -> bytes:
    """`blob` with a new random 16-byte report id at each offset."""
    out = bytearray(blob)
    fresh = secrets.token_bytes(16 * len(offsets))
    for i, at in enumerate(offsets):
        out[at : at + 16] = fresh[16 * i : 16 * i + 16]
    return bytes(out)


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` now (VmRSS), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class RssSampler:
    """Samples a process's resident memory every `interval` s in a thread: `peak`,
    and `samples` as (monotonic time, bytes)."""

    def __init__(self, pid: int, *, interval: float = 0.02) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            except (FileNotFoundError, ProcessLookupError, RuntimeError):
                return
            self._stop.wait(self.interval)

    @property
    def peak(self) -> int:
        return max((b for _, b in self.samples), default=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class LoadResult:
    """What a load run saw: status code name -> calls, calls refused for overload
    (RESOURCE_EXHAUSTED or UNAVAILABLE) with and without a `retry-after-ms` hint."""

    codes: dict[str, int] = field(default_factory=dict)
    with_hint: int = 0
    without_hint: int = 0

    def count(self, code: str, hinted: bool | None) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1
        if hinted is True:
            self.with_hint += 1
        elif hinted is False:
            self.without_hint += 1


async def _load(
    address: str,
    make_request: Callable[[], bytes],
    metadata: Sequence[tuple[str, str]],
    *,
    concurrency: int,
    connections: int,
    seconds: float,
    timeout: float,
    method: str,
    metadata_for: Callable[[int], Sequence[tuple[str, str]]] | None = None,
) -> LoadResult:
    import grpc
    import grpc.aio

    result = LoadResult()
    channels = [
        grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
        )
        for _ in range(max(1, connections))
    ]
    deadline = time.monotonic() + seconds

    async def caller(i: int) -> None:
        call_fn = channels[i % len(channels)].unary_unary(method, None, None)
        mine = tuple(metadata_for(i) if metadata_for is not None else metadata)
        while time.monotonic() < deadline:
            try:
                await call_fn(make_request(), metadata=mine, timeout=timeout)
                result.count("OK", None)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                overload = code in (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.UNAVAILABLE,
                )
                trailers: Any = exc.trailing_metadata() or ()
                hinted = any(key == "retry-after-ms" for key, _ in trailers)
                result.count(code.name, hinted if overload else None)

    try:
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
    finally:
        for ch in channels:
            await ch.close(None)
    return result


def run_load(
    address: str,
    make_request: Callable[[], bytes],
    metadata: Sequence[tuple[str, str]] = (),
    *,
    concurrency: int,
    connections: int,
    seconds: float,
    timeout: float = 30.0,
    method: str = SUBMIT_METHOD,
    metadata_for: Callable[[int], Sequence[tuple[str, str]]] | None = None,
) -> LoadResult:
    """Keep `concurrency` calls of raw request bytes in flight over `connections`
    connections for `seconds` (grpc.aio, on a fresh event loop in this thread).
    `metadata_for(i)`, when given, is caller i's metadata instead of `metadata`
    (a fleet of subjects rather than one)."""
    return asyncio.run(
        _load(
            address,
            make_request,
            metadata,
            concurrency=concurrency,
            connections=connections,
            seconds=seconds,
            timeout=timeout,
            method=method,
            metadata_for=metadata_for,
        )
    )


class ChargedUnderRetiredRule:
    """A verified memoized policy as a collector before the sound charge charged it:
    the retired r* per report (`retired_report_charge`); everything else the policy's."""

    def __init__(self, policy: VerifiedPolicy) -> None:
        self._policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    @property
    def charge(self) -> Decimal:
        """The retired rule's per-report charge."""
        mechanism: Any = self._policy.mechanism
        return Decimal(mechanism.retired_report_charge)
