"""`fedldp demo`: the whole pipeline, real at every step, on one machine.

1. An authority generates a root key and a policy-signing key, and signs a
   categorical policy (k-ary randomized response, ε per report, a per-user cap)
   into a data folder: ``keys/``, ``trust/``, ``policies/``.
2. A collector daemon starts as a separate process (`fedldp collector serve`)
   on a loopback port the OS picks, with an embedded SQLite ledger.
3. Simulated devices run the real SDK (`fedldp.Client`) over real gRPC: each
   fetches and verifies the signed policy, randomizes its value once, persists
   the report in its own outbox and sends it. Every tenth device then tries a
   second report in the same window, which its on-device budget guard refuses;
   a few devices "reinstall the app" (their state is wiped) and try again,
   which the collector's ledger refuses for budget.
4. The collector is stopped (drained), and the aggregator reads the ledger's
   additive statistics, debiases them into frequency estimates with confidence
   intervals from the exact variance, prints them beside the true frequencies,
   and writes a self-contained HTML report.

`--scenario open-domain` runs the same pipeline on an open domain: a signed
PEM policy (`fedldp.client.mechanisms.pem`) over strings of up to 8 bytes,
devices record new words from a Zipf vocabulary with
``client.record("browser.new_word", word)``, and the report lists the words
discovery found (`fedldp.aggregator.discovery`) with estimates and intervals.

The seed, when given, drives only the simulation (the true values and the
devices' randomizers); without it the devices use the OS CSPRNG as in
production. Every process the demo starts is stopped, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from fedldp.cli_common import decimal_option

POLICY_ID = "demo.browser-homepage"
METRIC = "browser.homepage"
AUDIENCE = "demo"
WINDOW_SECONDS = 86_400
#: Zipf exponent of the simulated population (BENCHMARKS.md's synthetic data).
ZIPF_EXPONENT = 1.1
COLLECTOR_START_TIMEOUT_S = 60.0
#: The device counter of reports the collector refused for budget (fedldp.client.outbox).
BUDGET_REFUSAL_COUNTER = "refused_outcome_budget_exhausted"
#: Every this many devices also tries a second report in the window (its guard refuses).
GUARD_DEMO_EVERY = 10
#: The open-domain scenario: a PEM policy over new words of up to OPEN_MAX_BYTES bytes.
OPEN_POLICY_ID = "demo.browser-new-word"
OPEN_METRIC = "browser.new_word"
OPEN_MAX_BYTES = 8
#: Its release minimum. For pem the gate applies to the smallest group's report count
#: (aggregator/reports.py), about n / 15 here: with 1000 devices (65 per group on
#: average) a group falls below 25 with probability < 1e-7.
OPEN_MIN_REPORTS = 25
#: Its head vocabulary (most frequent first); a long tail of random words follows.
NEW_WORDS = (
    "selfie", "emoji", "vlog", "hashtag", "podcast", "meme", "unfriend", "binge",
    "hangry", "phablet", "adorbs", "bromance", "glamping", "listicle", "hotdesk",
    "woke", "yeet", "ghosting", "stan", "doomscrl", "rizz", "vibe", "simp", "finsta",
    "photobmb", "lewk", "sus", "cheugy", "bae", "fomo",
)  # fmt: skip
OPEN_TAIL_WORDS = 300
#: Default ε per report of each scenario.
#: The shuffle demo's policy: no batch below this many reports is released.
SHUFFLE_MIN_BATCH = 2
DEFAULT_EPSILON = {"homepage": "2", "open-domain": "8"}


@dataclass
class Tally:
    """What happened to the simulated devices' reports (thread-safe counters)."""

    accepted: int = 0
    duplicates: int = 0
    refused_by_collector_budget: int = 0
    refused_by_device_guard: int = 0
    refused_other: int = 0
    pending: int = 0
    failed_devices: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **counts: int) -> None:
        """Add each count to the field of that name (thread-safe)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def counts(self) -> dict[str, int]:
        """The counters as a plain dict (to send between processes)."""
        with self.lock:
            return {name: value for name, value in vars(self).items() if isinstance(value, int)}


def _labels(domain_size: int) -> list[str]:
    return [f"site-{i:02d}.example" for i in range(domain_size)]


def _new_words(rng: random.Random) -> list[str]:
    """NEW_WORDS, then OPEN_TAIL_WORDS distinct random lowercase words (5..8 letters)."""
    words = dict.fromkeys(NEW_WORDS)
    while len(words) < len(NEW_WORDS) + OPEN_TAIL_WORDS:
        size = rng.randint(5, OPEN_MAX_BYTES)
        words["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(size))] = None
    return list(words)


def _zipf_values(rng: random.Random, domain_size: int, count: int) -> list[int]:
    weights = [1.0 / (rank**ZIPF_EXPONENT) for rank in range(1, domain_size + 1)]
    return rng.choices(range(domain_size), weights=weights, k=count)


def _parse_decimal(text: str, name: str) -> Decimal:
    value = decimal_option(text, name)
    if value <= 0:
        raise click.BadParameter(f"{name} must be finite and positive")
    return value


# --- setting up the authority, the policy and the collector ---------------------------


@dataclass(frozen=True)
class Deployment:
    """The files the demo writes, and what devices need to trust them."""

    out: Path
    root_envelope: Any
    root_public_keys: list[Any]
    token_secret: bytes
    collector_config: Path
    ledger_url: str


def _write_deployment(
    out: Path,
    *,
    labels: Sequence[str],
    epsilon: Decimal,
    epsilon_cap: Decimal,
    now: int,
    open_domain: bool = False,
    analyzer_key: bytes | None = None,
) -> Deployment:
    """Keys, trust folder, the signed policy (a shuffle-model one when `analyzer_key` is
    given: docs/shuffle.md), the token secret and collector.toml under `out`."""
    import secrets

    from fedldp.authoring import Authority, write_envelope, write_private_key, write_public_key

    authority = Authority.generate(now=now - 60)
    for sub in ("keys", "trust/pinned", "policies"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    write_private_key(authority.root_key, out / "keys" / "root.key")
    write_private_key(authority.policy_key, out / "keys" / "policy.key")
    write_public_key(authority.root_public_keys[0], out / "trust" / "pinned" / "root.pem")
    write_envelope(authority.root_envelope, out / "trust" / "1.root")
    if open_domain:
        policy = authority.open_policy(
            policy_id=OPEN_POLICY_ID,
            metric=OPEN_METRIC,
            max_bytes=OPEN_MAX_BYTES,
            epsilon=str(epsilon),
            epsilon_cap=str(epsilon_cap),
            window_seconds=WINDOW_SECONDS,
            now=now - 60,
            mechanism="pem",
            min_reports=OPEN_MIN_REPORTS,
            audience=(AUDIENCE,),
            purpose="demo: which new words do people type?",
        )
    else:
        policy = authority.categorical_policy(
            policy_id=POLICY_ID,
            metric=METRIC,
            labels=list(labels),
            epsilon=str(epsilon),
            epsilon_cap=str(epsilon_cap),
            window_seconds=WINDOW_SECONDS,
            now=now - 60,
            mechanism="grr",
            min_reports=100,
            audience=(AUDIENCE,),
            purpose="demo: which home page do people use?",
        )
    if analyzer_key is not None:
        policy.shuffle.analyzer_public_key = analyzer_key
        policy.shuffle.min_batch = SHUFFLE_MIN_BATCH
    write_envelope(authority.sign(policy), out / "policies" / f"{policy.policy_id}.policy")
    secret = secrets.token_bytes(32)
    secret_file = out / "keys" / "token-secret.hex"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:  # 0600 from the start
        handle.write(secret.hex())
    ledger_url = f"sqlite:///{(out / 'ledger.db').resolve()}"
    config = out / "collector.toml"
    config.write_text(
        "\n".join(
            [
                'listen = "127.0.0.1:0"',
                f'ledger_url = "{ledger_url}"',
                f'trust_dir = "{(out / "trust").resolve()}"',
                f'policy_dir = "{(out / "policies").resolve()}"',
                f'audience = "{AUDIENCE}"',
                f'token_secret_file = "{secret_file.resolve()}"',
                "rate_limit_per_second = 100000.0",
                "rate_limit_burst = 100000.0",
                'log_level = "WARNING"',
                # Each simulated device sends one report per call: the workload the
                # asyncio server is measured best at (docs/collector.md, "Server
                # choice"); it costs the collector less CPU per call than the sync one.
                'server = "asyncio"',
                "",
            ]
        ),
        encoding="utf-8",
    )
    return Deployment(
        out=out,
        root_envelope=authority.root_envelope,
        root_public_keys=list(authority.root_public_keys),
        token_secret=secret,
        collector_config=config,
        ledger_url=ledger_url,
    )


@contextlib.contextmanager
def _collector_process(deployment: Deployment) -> Iterator[str]:
    """Run `fedldp collector serve` in its own process; yield its address; always stop it."""
    port_file = deployment.out / "collector.port"
    port_file.unlink(missing_ok=True)
    log_path = deployment.out / "collector.log"
    command = [
        sys.executable,
        "-m",
        "fedldp.collector",
        "serve",
        "--config",
        str(deployment.collector_config),
        "--port-file",
        str(port_file),
    ]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the demo, which then stops it cleanly
        )
        try:
            deadline = time.monotonic() + COLLECTOR_START_TIMEOUT_S
            while not port_file.exists():
                if process.poll() is not None:
                    raise click.ClickException(
                        f"the collector exited with status {process.returncode}; see {log_path}"
                    )
                if time.monotonic() > deadline:
                    raise click.ClickException(f"the collector did not start; see {log_path}")
                time.sleep(0.05)
            yield f"127.0.0.1:{int(port_file.read_text(encoding='ascii'))}"
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # drains in-flight requests, then exits
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# --- the simulated fleet ------------------------------------------------------------------


@dataclass(frozen=True)
class FleetSpec:
    """What a worker process needs to simulate devices (picklable: bytes and strings)."""

    address: str
    labels: tuple[str, ...]
    root_envelope: bytes
    root_public_keys: tuple[bytes, ...]
    token_secret: bytes
    state_root: str
    seed: int | None
    max_epsilon: str
    threads: int
    metric: str = METRIC


class Fleet:
    """Runs simulated devices through the real SDK against one collector."""

    def __init__(self, spec: FleetSpec) -> None:
        import grpc
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        from fedldp.client.sdk import TrustRoot
        from fedldp.collector.auth import TokenAuthority
        from fedldp.v1 import policy_pb2

        self.spec = spec
        # The pinned root, verified once per worker: every simulated app ships the
        # same one, and each Client takes a private copy of this store (a copy
        # shares its verified root and serialized bytes, so a device does not
        # parse and verify the root again).
        self.trust_root = TrustRoot(
            policy_pb2.SignedEnvelope.FromString(spec.root_envelope),
            [Ed25519PublicKey.from_public_bytes(key) for key in spec.root_public_keys],
        ).trust_store(now=int(time.time()))
        self.tokens = TokenAuthority(spec.token_secret)
        self.state_root = Path(spec.state_root)
        self.tally = Tally()
        # The simulated devices of one process share one HTTP/2 connection; each
        # keeps its own credentials, state file, outbox and budget guard.
        self.channel = grpc.insecure_channel(spec.address)

    def _client(self, device: int, state_name: str) -> Any:
        from fedldp.client.sdk import Client
        from fedldp.client.transport import Credentials

        token = self.tokens.mint(f"device-{device:06d}", expires_at=int(time.time()) + 3600)
        # A seed drives the simulation only; without one each device uses the OS CSPRNG.
        seed = self.spec.seed
        rng = None if seed is None else random.Random(f"{seed}/{state_name}")
        return Client(
            self.spec.address,
            trust_root=self.trust_root,
            state_dir=self.state_root / state_name,
            credentials=Credentials.insecure_bearer(token),
            max_epsilon=Decimal(self.spec.max_epsilon),
            audience=AUDIENCE,
            timeout_seconds=30.0,
            rng=rng,
            channel=self.channel,
        )

    def _send(self, client: Any, *, may_be_refused_for_budget: bool = False) -> None:
        result = client.flush(timeout=60.0)
        budget_refusals = 0
        if may_be_refused_for_budget and result.refused:
            budget_refusals = client.counters().get(BUDGET_REFUSAL_COUNTER, 0)
        self.tally.add(
            accepted=result.acknowledged - result.duplicates,
            duplicates=result.duplicates,
            pending=result.pending,
            refused_by_collector_budget=budget_refusals,
            refused_other=result.refused - budget_refusals,
        )

    def run_device(self, device: int, value: int, reinstall: bool) -> None:
        """One device: record; some try again (their guard refuses) or reinstall and retry."""
        from fedldp.client.sdk import BudgetGuardError

        label = self.spec.labels[value]
        try:
            with self._client(device, f"d{device:06d}") as client:
                client.record(self.spec.metric, label)
                if device % GUARD_DEMO_EVERY == 0:
                    # A second report in the window: the device's own guard refuses it.
                    try:
                        client.record(self.spec.metric, label)
                    except BudgetGuardError:
                        self.tally.add(refused_by_device_guard=1)
                self._send(client)
            if reinstall:
                # The app's data was wiped: the device's own guard has forgotten its
                # spend, so only the collector's ledger stands between it and the cap.
                with self._client(device, f"d{device:06d}-reinstalled") as client:
                    client.record(self.spec.metric, label)
                    self._send(client, may_be_refused_for_budget=True)
        except Exception:
            logging.getLogger("fedldp.demo").exception("device %d failed", device)
            self.tally.add(failed_devices=1)
        finally:
            shutil.rmtree(self.state_root / f"d{device:06d}", ignore_errors=True)
            if reinstall:
                shutil.rmtree(self.state_root / f"d{device:06d}-reinstalled", ignore_errors=True)


_WORKER_FLEET: Fleet | None = None


def _init_worker(spec: FleetSpec) -> None:
    global _WORKER_FLEET
    # Ctrl-C is handled by the parent, which cancels the pool and stops the collector.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    _WORKER_FLEET = Fleet(spec)


def _run_chunk(devices: Sequence[tuple[int, int, bool]]) -> dict[str, int]:
    """Simulate `devices` (id, true value index, reinstalls) in this worker; return its tally."""
    fleet = _WORKER_FLEET
    assert fleet is not None, "worker not initialized"
    fleet.tally = Tally()
    with ThreadPoolExecutor(fleet.spec.threads, thread_name_prefix="device") as executor:
        list(executor.map(lambda d: fleet.run_device(*d), devices))
    return fleet.tally.counts()


def _run_fleet(
    spec: FleetSpec,
    values: Sequence[int],
    reinstalls: set[int],
    processes: int,
    chunk_size: int = 100,
) -> Tally:
    """Simulate every device across worker processes, with a progress bar."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm import tqdm

    devices = [(i, value, i in reinstalls) for i, value in enumerate(values)]
    chunks = [devices[i : i + chunk_size] for i in range(0, len(devices), chunk_size)]
    total = Tally()
    executor = ProcessPoolExecutor(
        max_workers=processes,
        mp_context=multiprocessing.get_context("spawn"),  # no fork of gRPC state
        initializer=_init_worker,
        initargs=(spec,),
    )
    try:
        futures = {executor.submit(_run_chunk, chunk): len(chunk) for chunk in chunks}
        with tqdm(total=len(devices), unit="device", desc="devices", file=sys.stderr) as bar:
            for future in as_completed(futures):
                total.add(**future.result())
                bar.update(futures[future])
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return total


# --- the analyst's view -----------------------------------------------------------------


def _report(deployment: Deployment, now: int, confidence: float) -> Any:
    from fedldp.aggregator.reports import report_from_ledgers
    from fedldp.client.policy.files import load_policy_folder, load_trust_folder
    from fedldp.collector.ledger import open_ledger

    trust = load_trust_folder(deployment.out / "trust", now=now)
    policies, problems = load_policy_folder(
        deployment.out / "policies", trust, now=now, audience=AUDIENCE
    )
    if problems or len(policies) != 1:
        raise click.ClickException(f"could not load the demo policy: {problems}")
    policy = policies[0]
    ledger = open_ledger(deployment.ledger_url)
    try:
        return report_from_ledgers(
            [("demo", ledger)],
            policy,
            window_start=policy.window_start(now),
            confidence=confidence,
        )
    finally:
        ledger.close()


@click.command(name="demo")
@click.option("--devices", default=10_000, show_default=True, help="simulated devices")
@click.option(
    "--scenario",
    type=click.Choice(["homepage", "open-domain"]),
    default="homepage",
    show_default=True,
    help="homepage: a categorical policy (GRR); open-domain: discover new words (PEM)",
)
@click.option(
    "--epsilon",
    default=None,
    help="ε per report (decimal)  [default: 2 homepage, 8 open-domain]",
)
@click.option(
    "--domain-size", default=8, show_default=True, help="number of categories k (homepage)"
)
@click.option(
    "--cap",
    "epsilon_cap",
    default=None,
    help="per-user ε cap per day (decimal; default: one report's ε)",
)
@click.option(
    "--reinstall-fraction",
    default=0.02,
    show_default=True,
    help="share of devices whose state is wiped and which report again",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="seed for the simulation only (true values, device randomizers); "
    "default: OS entropy, as on real devices",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("fedldp-demo"),
    show_default=True,
    help="output folder (keys, policies, ledger, HTML report); replaced if it exists",
)
@click.option(
    "--processes",
    default=max(1, os.cpu_count() or 1),
    show_default="CPU count",
    help="worker processes simulating devices",
)
@click.option("--threads", default=8, show_default=True, help="devices at once per process")
@click.option("--confidence", default=0.95, show_default=True, help="confidence level of the CIs")
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="then serve `fedldp dashboard` on the demo's ledger (127.0.0.1) until Ctrl-C",
)
@click.option(
    "--release-service",
    "with_release_service",
    is_flag=True,
    help="also run the trusted release service on a generated consolidated table: one count "
    "and one mean, with error bars and verified receipts in the HTML report",
)
@click.option(
    "--shuffle",
    "with_shuffle",
    is_flag=True,
    help="shuffle model (homepage only): devices seal their reports to an analyzer key; the "
    "collector, a shuffler and the analyzer run as three roles; prints the local ε0 and the "
    "amplified central (ε, δ) (docs/shuffle.md)",
)
@click.option(
    "--web",
    "with_web",
    is_flag=True,
    help="no simulated devices: start the collector with its web endpoint and serve a page "
    "that records into it from a browser; prints the page's URL (docs/sdk.md, 'Browsers')",
)
@click.option(
    "--web-for",
    "web_seconds",
    type=float,
    default=None,
    help="with --web: stop after this many seconds (default: at Ctrl-C)",
)
def demo(
    scenario: str,
    devices: int,
    epsilon: str | None,
    domain_size: int,
    epsilon_cap: str | None,
    reinstall_fraction: float,
    seed: int | None,
    out: Path,
    processes: int,
    threads: int,
    confidence: float,
    with_dashboard: bool,
    with_release_service: bool,
    with_shuffle: bool = False,
    with_web: bool = False,
    web_seconds: float | None = None,
) -> None:
    """Run the whole pipeline: signed policy, collector, simulated devices, report."""
    from fedldp.aggregator.render import render_html, render_table

    open_domain = scenario == "open-domain"
    eps = _parse_decimal(epsilon or DEFAULT_EPSILON[scenario], "--epsilon")
    cap = _parse_decimal(epsilon_cap, "--cap") if epsilon_cap is not None else eps
    _check_options(devices, domain_size, threads, processes, reinstall_fraction, confidence)
    if with_shuffle and (open_domain or with_dashboard or with_release_service or with_web):
        raise click.BadParameter("--shuffle runs the homepage scenario alone")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    now = int(time.time())
    if with_web:  # a person clicks more than once a day: the cap defaults to 50 reports' worth
        return _web_demo(
            out, _labels(domain_size), eps, cap if epsilon_cap else eps * 50, now, web_seconds
        )
    population = random.Random(seed) if seed is not None else random.SystemRandom()
    labels = _new_words(population) if open_domain else _labels(domain_size)
    values = _zipf_values(population, len(labels), devices)
    reinstalls = set(population.sample(range(devices), round(devices * reinstall_fraction)))

    started = time.perf_counter()
    deployment = _deploy(out, labels, (eps, cap), now, open_domain, shuffle=with_shuffle)
    if open_domain:
        click.echo(
            f"signed policy {OPEN_POLICY_ID}: PEM, strings of up to {OPEN_MAX_BYTES} bytes, "
            f"ε={eps} per report, cap {cap}/day"
        )
    else:
        click.echo(
            f"signed policy {POLICY_ID}: GRR, k={domain_size}, ε={eps} per report, cap {cap}/day"
        )
    # Device state on a memory-backed folder when there is one: thousands of tiny
    # SQLite files, created and discarded; the collector's ledger stays on disk.
    shm = Path("/dev/shm")
    state_root = Path(tempfile.mkdtemp(prefix="fedldp-devices-", dir=shm if shm.is_dir() else None))
    try:
        with _collector_process(deployment) as address:
            click.echo(f"collector listening on {address} (ledger {out / 'ledger.db'})")
            spec = FleetSpec(
                address=address,
                labels=tuple(labels),
                root_envelope=deployment.root_envelope.SerializeToString(),
                root_public_keys=tuple(
                    key.public_bytes_raw() for key in deployment.root_public_keys
                ),
                token_secret=deployment.token_secret,
                state_root=str(state_root),
                seed=seed,
                max_epsilon=str(eps),
                threads=threads,
                metric=OPEN_METRIC if open_domain else METRIC,
            )
            tally = _run_fleet(spec, values, reinstalls, processes)
    finally:
        shutil.rmtree(state_root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    counts = Counter(values)
    truth = {labels[i]: counts[i] / devices for i in range(len(labels))}
    if with_shuffle:
        _shuffle_demo(deployment, now, truth, tally, (devices, elapsed))  # exits
    report = _report(deployment, now, confidence)
    click.echo("")
    click.echo(render_table(report, truth=truth))
    click.echo("")
    _echo_tally(tally, devices, elapsed)
    html_path = render_html(report, out / "report.html", truth=truth)
    if with_release_service:
        _release_service_demo(out, seed, html_path)
    click.echo(f"HTML report: {html_path.resolve()}")
    if tally.failed_devices:
        raise SystemExit(1)
    if with_dashboard:
        _serve_dashboard(deployment, with_release_service)


def _shuffle_demo(
    deployment: Deployment,
    now: int,
    truth: dict[str, float],
    tally: Tally,
    run: tuple[int, float],
) -> None:
    """The rest of `demo --shuffle`: the tally, then the shuffler and the analyzer
    (fedldp.demo_shuffle); exits with status 1 when a device failed, else 0."""
    from fedldp.demo_shuffle import shuffle_roles

    _echo_tally(tally, *run)
    shuffle_roles(deployment.out, deployment.collector_config, now, truth, tally.accepted)
    raise SystemExit(1 if tally.failed_devices else 0)


def _web_demo(
    out: Path, labels: list[str], eps: Decimal, cap: Decimal, now: int, seconds: float | None
) -> None:
    """`--web`: fedldp.demo_web.run_web_demo."""
    from fedldp.demo_web import run_web_demo

    run_web_demo(out, labels=labels, epsilon=eps, epsilon_cap=cap, now=now, seconds=seconds)


def _echo_tally(tally: Any, devices: int, elapsed: float) -> None:
    """The fleet's outcome lines (devices, accepted, refused, anything else)."""
    click.echo(f"devices simulated:                   {devices} in {elapsed:.1f} s")
    click.echo(f"reports accepted:                    {tally.accepted}")
    click.echo(f"refused by the collector for budget: {tally.refused_by_collector_budget}")
    click.echo(f"refused on device by budget guard:   {tally.refused_by_device_guard}")
    if tally.refused_other or tally.pending or tally.failed_devices or tally.duplicates:
        click.echo(
            f"other refusals: {tally.refused_other}, still pending: {tally.pending}, "
            f"duplicates: {tally.duplicates}, failed devices: {tally.failed_devices}"
        )


def _check_options(
    devices: int,
    domain_size: int,
    threads: int,
    processes: int,
    reinstall_fraction: float,
    confidence: float,
) -> None:
    """A usage error for a count or fraction out of its range."""
    if devices < 1 or domain_size < 2 or threads < 1 or processes < 1:
        raise click.BadParameter(
            "--devices, --processes, --threads must be >= 1; --domain-size >= 2"
        )
    if not 0.0 <= reinstall_fraction <= 1.0 or not 0.0 < confidence < 1.0:
        raise click.BadParameter("--reinstall-fraction in [0, 1], --confidence in (0, 1)")


def _deploy(
    out: Path,
    labels: Sequence[str],
    budget: tuple[Decimal, Decimal],
    now: int,
    open_domain: bool,
    *,
    shuffle: bool,
) -> Deployment:
    """`_write_deployment` with (ε, cap) = `budget`; with `shuffle`, a new analyzer key first
    and a shuffle-model policy sealed to it."""
    return _write_deployment(
        out,
        labels=labels,
        epsilon=budget[0],
        epsilon_cap=budget[1],
        now=now,
        open_domain=open_domain,
        analyzer_key=_analyzer_key(out) if shuffle else None,
    )


def _analyzer_key(out: Path) -> bytes:
    """A new analyzer key pair under out/analyzer (`fedldp shuffler keygen`); its public key."""
    from fedldp.aggregator.shuffle_analyzer import generate_analyzer_key

    _, public = generate_analyzer_key(out / "analyzer")
    return public


def _release_service_demo(out: Path, seed: int | None, report: Path) -> None:
    """Run fedldp.demo_release and add its section to the HTML report."""
    from fedldp.demo_release import (
        append_to_report,
        release_html,
        run_release_demo,
        short,
        training_summary,
    )

    demo = run_release_demo(out, seed)
    click.echo("")
    click.echo("release service (count and mean of a generated table, ε = 0.25 each):")
    for r in demo.releases:
        check = "receipt verified" if r.verified else "RECEIPT FAILED"
        click.echo(
            f"  {r.kind:<5} {short(r.value):>10}  noise sd {r.noise_stddev:.3g}  "
            f"{float(r.confidence):.0%} interval [{short(r.lower)}, {short(r.upper)}]  "
            f"{check}: {r.receipt}"
        )
    if isinstance(demo.training, str):
        click.echo(f"  {demo.training}")
    else:
        click.echo(
            "  training job: " + ", ".join(f"{k} {v}" for k, v in training_summary(demo.training))
        )
    append_to_report(report, release_html(demo))
    if not all(r.verified for r in demo.releases):
        raise click.ClickException("a release receipt did not verify")
    if not isinstance(demo.training, str) and not demo.training.verified:
        raise click.ClickException("the training job did not succeed with a verified receipt")


def _serve_dashboard(deployment: Deployment, with_release_service: bool) -> None:
    """`fedldp dashboard` on the demo's ledger (read-only), on a free loopback port; with
    the release service, its own ledger's central spend on the budget page too."""
    from fedldp.cli_dashboard import serve_dashboard
    from fedldp.demo_release import release_ledger_url

    serve_dashboard(
        deployment.ledger_url,
        deployment.out / "policies",
        deployment.out / "trust",
        AUDIENCE,
        host="127.0.0.1",
        port=0,
        token=None,
        central=[release_ledger_url(deployment.out)] if with_release_service else [],
    )


if __name__ == "__main__":  # pragma: no cover
    demo()
    os._exit(0)
