"""Every `fedldp` subcommand against a matrix of bad inputs, as a new user would type them.

Each case must exit non-zero with a one-line ``Error: ...`` on stderr and no Python
traceback (issue 17: 16 of 82 such runs printed one). Reading commands must not
create what they were pointed at: after every case, the mistyped ledger paths and
folders still do not exist.

Each case is its own test (so pytest-xdist spreads the matrix over its workers).
Most run in-process through click's CliRunner, the same `main` the `fedldp` script
calls; the daemons, whose start-up is the point (`collector serve` and `release-service
serve`: logging set up for the process, signal handlers, child processes), run as
a real `fedldp` process (`SUBPROCESS_COMMANDS`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from collector_testkit import Deployment, checked_report, write_config
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.authoring import write_private_key, write_public_key
from fedldp.collector.ledger import SubmitBatch, open_ledger, restore
from fedldp.collector.ledger.shards import open_sharded, read_map
from server_extras import SERVER_MODULES

from fedldp.cli import main

FEDLDP = str(Path(sys.executable).with_name("fedldp"))


@dataclass(frozen=True)
class Env:
    """A valid demo environment and bad inputs around it."""

    base: Path
    config: Path  # a valid collector.toml
    ledger: str  # an existing ledger's URL
    trust: Path
    policies: Path
    secret: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("bad-inputs")
    deployment = Deployment.create(now=int(time.time()))
    deployment.add_categorical("demo.color")
    deployment.add_open(
        "demo.word",
        mechanism="cms",
        max_bytes=32,
        epsilon="2",
        epsilon_cap="8",
        params={"rows": "4", "columns": "16"},
    )
    url = f"sqlite:///{base / 'ledger.db'}"
    open_ledger(url).close()
    # `processes` unset, as an operator's file leaves it: the default (the cores), so
    # `collector serve` rows go through the supervisor where the machine has 2+ cores.
    config = write_config(deployment, base, url, "good", processes=None)
    (base / "junk.db").write_bytes(b"this is not a database\n" * 20)
    (base / "bad.toml").write_text("[collector\nlisten = \n", encoding="utf-8")
    (base / "empty.policy").write_bytes(b"")
    (base / "data.txt").write_text("1\n2\n3\n", encoding="utf-8")
    (base / "long-candidate.txt").write_text("ok\n" + "x" * 40 + "\n", encoding="utf-8")
    (base / "latin1-candidates.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    (base / "no-candidates.txt").write_text("\n\n", encoding="utf-8")
    (base / "receipt.json").write_text("{not json", encoding="utf-8")
    (base / "nonhex.secret").write_text("zz-not-hex\n", encoding="ascii")
    (base / "catalog.toml").write_text("[groups]\n", encoding="utf-8")
    (base / "release-policy.toml").write_text("version = 1\n", encoding="utf-8")
    release_key = Ed25519PrivateKey.generate()
    write_private_key(release_key, base / "release.key")
    write_public_key(release_key.public_key(), base / "release.pub")
    good = config.read_text(encoding="utf-8")

    def variant(name: str, key: str, value: str) -> None:
        lines = [ln for ln in good.splitlines() if not ln.startswith(f"{key} =")]
        (base / name).write_text("\n".join([*lines, f'{key} = "{value}"']) + "\n", "utf-8")

    variant("nonhex.toml", "token_secret_file", str(base / "nonhex.secret"))
    variant("noledgerdir.toml", "ledger_url", f"sqlite:///{base / 'nope' / 'ledger.db'}")
    variant("ledgerisdir.toml", "ledger_url", f"sqlite:///{base}")
    variant("notrust.toml", "trust_dir", str(base / "no-trust"))
    variant("badlisten.toml", "listen", "999.1.2.3:99999")
    variant("mysql.toml", "ledger_url", "mysql://u@localhost/db")
    variant("unknown.toml", "no_such_setting", "1")
    variant("both.toml", "ledger_shards", url)  # ledger_url and ledger_shards
    variant("junkledger.toml", "ledger_url", f"sqlite:///{base / 'junk.db'}")
    variant("closedpg.toml", "ledger_url", "postgresql+psycopg://fedldp@127.0.0.1:1/fedldp")
    variant("negrate.toml", "rate_limit_per_second", "-1.0")
    variant("loud.toml", "log_level", "LOUD")
    variant("port70000.toml", "listen", "127.0.0.1:70000")
    variant("nosecret.toml", "token_secret_file", str(base / "no-such.secret"))
    # A ledger whose restore never recorded its epoch (RestoreIncompleteError).
    incomplete = f"sqlite:///{base / 'incomplete.db'}"
    open_ledger(incomplete).close()
    engine = sa.create_engine(incomplete)
    with engine.begin() as connection:
        restore.begin_restore(connection, source="test", started_at=int(time.time()))
    engine.dispose()
    variant("incomplete.toml", "ledger_url", incomplete)
    _sharded_variants(deployment, base, good)
    _shuffler_configs(base)
    made = CliRunner().invoke(main, ["ledger", "backup", "--ledger", url, str(base / "good.bak")])
    assert made.exit_code == 0, made.output
    yield Env(base, config, url, base / "trust", base / "policies", base / "token.secret")


def _sharded_variants(deployment: Deployment, base: Path, good: str) -> None:
    """A two-shard ledger (sh0, sh1) and configs that misuse it: the old list of one
    shard (stale-shards), shard 1 as ledger_url (shard1), and a first start listing
    a charged plain ledger with an empty one (charged-shards)."""
    sh0, sh1 = (f"sqlite:///{base / f'sh{i}.db'}" for i in (0, 1))
    open_sharded([sh0, sh1]).close()
    charged, fresh = f"sqlite:///{base / 'charged.db'}", f"sqlite:///{base / 'fresh.db'}"
    policy = deployment.verified(deployment.envelopes[0])
    with open_ledger(charged) as led:
        led.submit_many([SubmitBatch("old", [checked_report(policy)], int(time.time()))])
    open_ledger(fresh).close()
    kept = [ln for ln in good.splitlines() if not ln.startswith("ledger_url =")]

    def write(name: str, line: str) -> None:
        (base / name).write_text("\n".join([*kept, line]) + "\n", "utf-8")

    write("stale-shards.toml", f'ledger_shards = ["{sh0}"]')
    write("shard1.toml", f'ledger_url = "{sh1}"')
    write("charged-shards.toml", f'ledger_shards = ["{charged}", "{fresh}"]')


def _shuffler_configs(base: Path) -> None:
    """shuffler.toml files for `shuffler serve`: one over a ledger that does not exist
    (absent.db, never created), one with four bad settings."""
    common = f'policy_dir = "{base / "policies"}"\ntrust_dir = "{base / "trust"}"\n'
    (base / "shuffler-noledger.toml").write_text(
        f'[shuffler]\nledger_url = "sqlite:///{base / "absent.db"}"\n{common}'
        'spool = "spool.db"\nout_dir = "never-out"\n',
        encoding="utf-8",
    )
    (base / "shuffler-bad.toml").write_text(
        f'[shuffler]\nledger_url = "sqlite:///{base / "absent.db"}"\n{common}'
        'spool = "nope/spool.db"\nout_dir = "never-out"\ninterval_seconds = -1\n'
        'grace_seconds = 1.5\ncolour = "red"\n',
        encoding="utf-8",
    )


def _shuffle_cases(env: Env) -> list[tuple[str, list[str]]]:
    """`shuffler serve` with bad configs (each refused before anything starts) and
    `report --batch` misused."""
    b = env.base
    serve = ["shuffler", "serve", "--config"]
    report = ["report", "--policy", "demo.color", "--policies", str(env.policies)]
    report += ["--trust", str(env.trust), "--batch", str(b / "data.txt")]
    return [
        ("shuffler serve --config malformed-toml", [*serve, str(b / "bad.toml")]),
        ("shuffler serve --config missing", [*serve, str(b / "nope.toml")]),
        ("shuffler serve --config collector.toml", [*serve, str(env.config)]),
        ("shuffler serve --config missing ledger", [*serve, str(b / "shuffler-noledger.toml")]),
        ("shuffler serve --config bad settings", [*serve, str(b / "shuffler-bad.toml")]),
        ("report --batch without --analyzer-key", report),
        ("report --batch not a batch file", [*report, "--analyzer-key", str(b / "data.txt")]),
    ]


def bad_ledgers(env: Env) -> dict[str, str]:
    b = env.base
    return {
        "missing-folder": f"sqlite:///{b / 'nope' / 'ledger.db'}",
        "missing-file": f"sqlite:///{b / 'absent.db'}",
        "a-directory": f"sqlite:///{b}",
        "not-a-database": f"sqlite:///{b / 'junk.db'}",
        "unparsable": "not-a-url",
        "mysql": "mysql://u@localhost/db",
        "unreachable-postgres": "postgresql+psycopg://fedldp:secret@127.0.0.1:1/fedldp",
        "in-memory": "sqlite://",
        "restore-incomplete": f"sqlite:///{b / 'incomplete.db'}",
    }


# Commands that create a ledger where a URL names none: a missing file is their job.
CREATORS = ("ledger init", "ledger migrate", "ledger restore")


def bad_configs(env: Env) -> dict[str, str]:
    b = env.base
    return {
        "malformed-toml": str(b / "bad.toml"),
        "missing": str(b / "nope.toml"),
        "a-directory": str(b),
        "unknown-key": str(b / "unknown.toml"),
        "missing-ledger-folder": str(b / "noledgerdir.toml"),
        "ledger-is-directory": str(b / "ledgerisdir.toml"),
        "mysql-ledger": str(b / "mysql.toml"),
    }


def ledger_commands(env: Env) -> dict[str, list[str]]:
    """Commands that take a ledger, without it (`--ledger URL` or `--config` is appended)."""
    d = str(env.base / "data.txt")
    release = ["--subject", "s", "--purpose", "p", "--epsilon", "1", "--key", "k", "--data", d]
    bounds = ["--lower", "0", "--upper", "10"]
    return {
        "ledger show": ["ledger", "show", "alice"],
        "ledger reconcile": ["ledger", "reconcile"],
        "ledger set-cap": ["ledger", "set-cap", "s", "p", "--epsilon", "1", "--delta", "0"],
        "report": [
            "report",
            "--policy",
            "demo.color",
            "--policies",
            str(env.policies),
            "--trust",
            str(env.trust),
        ],
        "release count": ["release", "count", *release],
        "release sum": ["release", "sum", *release, *bounds],
        "release mean": ["release", "mean", *release, *bounds],
        "release choice": ["release", "choice", *release, "--candidates", "a,b"],
        "release spend": ["release", "spend", "--subject", "s", "--purpose", "p"],
        "release-service consolidate": [*_consolidate(env)],
        "dashboard": [
            "dashboard",
            "--policies",
            str(env.policies),
            "--trust",
            str(env.trust),
            "--listen",
            "127.0.0.1:0",
        ],
    }


def _candidate_cases(env: Env) -> list[tuple[str, list[str]]]:
    """`fedldp report` on a sketch policy (demo.word, cms) and --candidates misused."""

    def report(policy: str, *extra: str) -> list[str]:
        return [
            "report",
            "--policy",
            policy,
            "--ledger",
            env.ledger,
            "--policies",
            str(env.policies),
            "--trust",
            str(env.trust),
            *extra,
        ]

    b = env.base
    return [
        ("report sketch without --candidates", report("demo.word")),
        (
            "report --candidates categorical",
            report("demo.color", "--candidates", str(b / "data.txt")),
        ),
        ("report --candidates missing", report("demo.word", "--candidates", str(b / "nope.txt"))),
        (
            "report --candidates too long",
            report("demo.word", "--candidates", str(b / "long-candidate.txt")),
        ),
        (
            "report --candidates not utf-8",
            report("demo.word", "--candidates", str(b / "latin1-candidates.txt")),
        ),
        (
            "report --candidates empty",
            report("demo.word", "--candidates", str(b / "no-candidates.txt")),
        ),
        (
            "report sketch with consistency",
            report("demo.word", "--candidates", str(b / "data.txt"), "--consistency", "norm-sub"),
        ),
    ]


def _consolidate(env: Env) -> list[str]:
    """`release-service consolidate` of demo.color, without its ledger."""
    return [
        "release-service", "consolidate", "--policy", "demo.color",
        "--policies", str(env.policies), "--trust", str(env.trust),
        "--out", f"sqlite:///{env.base / 'never-consolidated.db'}",
    ]  # fmt: skip


def ledger_admin_commands(env: Env) -> dict[str, list[str]]:
    """The `ledger` commands that create, copy or repair a ledger (`--ledger URL` appended;
    they read `--config` as the commands above do)."""
    return {
        "ledger init": ["ledger", "init"],
        "ledger migrate": ["ledger", "migrate"],
        "ledger backup": ["ledger", "backup", str(env.base / "never.bak")],
        "ledger restore": ["ledger", "restore", str(env.base / "good.bak")],
        "ledger confirm-central": ["ledger", "confirm-central", "--none"],
    }


def cases(env: Env) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for name, command in ledger_admin_commands(env).items():
        for bad, url in bad_ledgers(env).items():
            if not (bad == "missing-file" and name in CREATORS):
                out.append((f"{name} --ledger {bad}", [*command, "--ledger", url]))
    shard1 = f"sqlite:///{env.base / 'sh1.db'}"
    for name, command in ledger_commands(env).items():
        for bad, url in bad_ledgers(env).items():
            out.append((f"{name} --ledger {bad}", [*command, "--ledger", url]))
        out.append((f"{name} --ledger shard-1", [*command, "--ledger", shard1]))
        for bad, path in bad_configs(env).items():
            if bad in ("malformed-toml", "missing", "a-directory", "missing-ledger-folder"):
                out.append((f"{name} --config {bad}", [*command, "--config", path]))
    for name in ("ledger show", "ledger reconcile", "report", "release-service consolidate"):
        command = ledger_commands(env)[name]
        for bad in ("stale-shards", "shard1"):
            path = str(env.base / f"{bad}.toml")
            out.append((f"{name} --config {bad}", [*command, "--config", path]))
    out += [
        (
            "ledger confirm-central --ledger shard-1",
            ["ledger", "confirm-central", "--none", "--ledger", shard1],
        ),
        ("ledger reservations --ledger shard-1", ["ledger", "reservations", "--ledger", shard1]),
        (
            "ledger settle-stale --ledger shard-1",
            ["ledger", "settle-stale", "r1", "--ledger", shard1],
        ),
    ]
    configs = {**bad_configs(env)}
    collector_configs = ("junkledger", "closedpg", "negrate", "loud", "port70000", "nosecret")
    for extra in (
        "nonhex",
        "notrust",
        "badlisten",
        "incomplete",
        "charged-shards",
        *collector_configs,
    ):
        configs[extra] = str(env.base / f"{extra}.toml")
    for bad, path in configs.items():
        out.append((f"collector serve --config {bad}", ["collector", "serve", "--config", path]))
    for bad in ("malformed-toml", "missing", "a-directory", "nonhex"):
        path = configs[bad]
        out.append(
            (f"mint-token --config {bad}", ["collector", "mint-token", "d", "--config", path])
        )
    b = env.base

    def ask(kind: str) -> list[str]:
        """A `release KIND` with the options every mode takes (and a column)."""
        column = [] if kind == "count" else ["--column", "c"]
        return ["release", kind, "--purpose", "p", "--epsilon", "1", "--key", "k", *column]

    def local(kind: str) -> list[str]:
        """`release KIND` in the local mode (ledger, subject, data), before its own options."""
        return [
            "release",
            kind,
            "--purpose",
            "p",
            "--epsilon",
            "1",
            "--key",
            "k",
            "--ledger",
            env.ledger,
            "--subject",
            "s",
            "--data",
            str(b / "data.txt"),
        ]

    out += [
        (
            "ledger set-cap exponent",
            [
                "ledger",
                "set-cap",
                "s",
                "p",
                "--epsilon",
                "1e-3",
                "--delta",
                "0",
                "--ledger",
                env.ledger,
            ],
        ),
        (
            "ledger set-cap not a number",
            [
                "ledger",
                "set-cap",
                "s",
                "p",
                "--epsilon",
                "x",
                "--delta",
                "0",
                "--ledger",
                env.ledger,
            ],
        ),
        ("ledger show without a ledger", ["ledger", "show", "alice"]),
        ("ledger shards show without --config", ["ledger", "shards", "show"]),
        (
            "ledger shards add without --new",
            ["ledger", "shards", "add", "--config", str(env.config)],
        ),
        (
            "ledger shards add itself",
            ["ledger", "shards", "add", "--config", str(env.config), "--new", env.ledger],
        ),
        (
            "ledger shards add unreachable",
            [
                "ledger",
                "shards",
                "add",
                "--config",
                str(env.config),
                "--new",
                bad_ledgers(env)["unreachable-postgres"],
            ],
        ),
        ("collector serve --config both", ["collector", "serve", "--config", str(b / "both.toml")]),
        (
            "collector serve --port-file in a missing folder",
            [
                "collector",
                "serve",
                "--config",
                str(env.config),
                "--port-file",
                str(b / "nope" / "p"),
            ],
        ),
        ("collector health port above 65535", ["collector", "health", "--addr", "127.0.0.1:99999"]),
        (
            "ledger restore a backup that is not a database",
            ["ledger", "restore", "--ledger", f"sqlite:///{b / 'r.db'}", str(b / "junk.db")],
        ),
        (
            "mint-token negative ttl",
            ["collector", "mint-token", "d", "--secret-file", str(env.secret), "--ttl", "-5"],
        ),
        (
            "mint-token unknown audience",
            ["collector", "mint-token", "d", "--secret-file", str(env.secret), "--audience", "x"],
        ),
        (
            "mint-token non-hex secret file",
            ["collector", "mint-token", "d", "--secret-file", str(b / "nonhex.secret")],
        ),
        (
            "release count exponent",
            [
                "release",
                "count",
                "--ledger",
                env.ledger,
                "--subject",
                "s",
                "--purpose",
                "p",
                "--epsilon",
                "1e-1",
                "--key",
                "k",
                "--data",
                str(b / "data.txt"),
            ],
        ),
        (
            "release count no cap",
            [
                "release",
                "count",
                "--ledger",
                env.ledger,
                "--subject",
                "s",
                "--purpose",
                "p",
                "--epsilon",
                "1",
                "--key",
                "k",
                "--data",
                str(b / "data.txt"),
            ],
        ),
        (
            "report unknown policy",
            [
                "report",
                "--policy",
                "no.such",
                "--ledger",
                env.ledger,
                "--policies",
                str(env.policies),
                "--trust",
                str(env.trust),
            ],
        ),
        (
            "report wrong audience",
            [
                "report",
                "--policy",
                "demo.color",
                "--ledger",
                env.ledger,
                "--policies",
                str(env.policies),
                "--trust",
                str(env.trust),
                "--audience",
                "elsewhere",
            ],
        ),
        (
            "report missing trust",
            [
                "report",
                "--policy",
                "demo.color",
                "--ledger",
                env.ledger,
                "--policies",
                str(env.policies),
                "--trust",
                str(b / "no-trust"),
            ],
        ),
        *_candidate_cases(env),
        ("policy show empty file", ["policy", "show", str(b / "empty.policy")]),
        ("policy show missing", ["policy", "show", str(b / "nope.policy")]),
        (
            "policy sign out in missing folder",
            [
                "policy",
                "sign",
                str(b / "data.txt"),
                "--key",
                str(b / "data.txt"),
                "--out",
                "/nonexistent-fedldp/p.policy",
            ],
        ),
        (
            "policy verify garbage",
            ["policy", "verify", str(b / "data.txt"), "--trust", str(env.trust)],
        ),
        ("keys id not a key", ["keys", "id", str(b / "data.txt")]),
        ("client status missing state", ["client", "status", "--state-dir", str(b / "no-state")]),
        ("client budget not a state dir", ["client", "budget", "--state-dir", str(b)]),
        ("train missing config", ["train", "--config", str(b / "nope.toml")]),
        ("train malformed config", ["train", "--config", str(b / "bad.toml")]),
        ("train nproc zero", ["train", "--config", str(b / "bad.toml"), "--nproc", "0"]),
        ("train nproc not a number", ["train", "--config", str(b / "bad.toml"), "--nproc", "x"]),
        ("verify training garbage receipt", ["verify", "training", str(b / "receipt.json")]),
        ("train neither config nor service", ["train"]),
        ("train service missing job options", ["train", "--service", "127.0.0.1:1"]),
        ("train service exponent epsilon", [*_service_job(b), "--epsilon", "1e-3"]),
        ("train service without token", _service_job(b)),
        ("train service with config", [*_service_job(b), "--config", str(b / "bad.toml")]),
        ("train status without service", ["train", "status", "0" * 32]),
        ("demo exponent epsilon", ["demo", "--epsilon", "1e-3", "--out", str(b / "demo-out")]),
        ("demo unknown scenario", ["demo", "--scenario", "words", "--out", str(b / "demo-out")]),
        (
            "demo open-domain exponent epsilon",
            ["demo", "--scenario", "open-domain", "--epsilon", "8e0", "--out", str(b / "demo-out")],
        ),
        ("verify mechanism max-bytes 0", ["verify", "mechanism", "-m", "pem", "--max-bytes", "0"]),
        (
            "verify mechanism pem bad g",
            ["verify", "mechanism", "-m", "pem", "--param", "g=6", "--samples", "10"],
        ),
        ("release count --service no dataset", [*ask("count"), "--service", "127.0.0.1:1"]),
        (
            "release sum --service with --lower",
            [*ask("sum"), "--service", "127.0.0.1:1", "--dataset", "d", "--lower", "0"],
        ),
        (
            "release mean --service no token",
            [*ask("mean"), "--service", "127.0.0.1:1", "--dataset", "d"],
        ),
        (
            "release histogram --embedded no catalog",
            [*ask("histogram"), "--embedded", "--dataset", "d"],
        ),
        ("release quantile --dataset without a service", [*ask("quantile"), "--dataset", "d"]),
        (
            "release quantile local no --quantile",
            [*local("quantile"), "--lower", "0", "--upper", "1"],
        ),
        (
            "release quantile exponent",
            [*local("quantile"), "--lower", "0", "--upper", "1", "--quantile", "5e-1"],
        ),
        ("release choice local no candidates", local("choice")),
        (
            "release-service query quantile no --quantile",
            [
                "release-service",
                "query",
                "quantile",
                "--service",
                "127.0.0.1:1",
                "--dataset",
                "d",
                "--purpose",
                "p",
                "--epsilon",
                "1",
                "--key",
                "k",
                "--column",
                "c",
            ],
        ),
        (
            "release-service serve unsigned policy",
            [
                "release-service",
                "serve",
                "--catalog",
                str(b / "catalog.toml"),
                "--policy",
                str(b / "release-policy.toml"),
                "--policy-key",
                str(b / "release.pub"),
                "--ledger",
                env.ledger,
                "--signing-key",
                str(b / "release.key"),
            ],
        ),
        (
            "release-service serve --mtls without --tls-cert",
            [
                "release-service",
                "serve",
                "--catalog",
                str(b / "catalog.toml"),
                "--policy",
                str(b / "release-policy.toml"),
                "--policy-key",
                str(b / "release.pub"),
                "--ledger",
                env.ledger,
                "--signing-key",
                str(b / "release.key"),
                "--mtls",
                "--tls-client-ca",
                str(b / "release.pub"),
            ],
        ),
        (
            "release-service serve --tls-client-ca without --mtls",
            [
                "release-service",
                "serve",
                "--catalog",
                str(b / "catalog.toml"),
                "--policy",
                str(b / "release-policy.toml"),
                "--policy-key",
                str(b / "release.pub"),
                "--ledger",
                env.ledger,
                "--signing-key",
                str(b / "release.key"),
                "--tls-cert",
                str(b / "release.pub"),
                "--tls-key",
                str(b / "release.key"),
                "--tls-client-ca",
                str(b / "release.pub"),
            ],
        ),
        (
            "release-service serve plaintext off loopback",
            [
                "release-service",
                "serve",
                "--catalog",
                str(b / "catalog.toml"),
                "--policy",
                str(b / "release-policy.toml"),
                "--policy-key",
                str(b / "release.pub"),
                "--ledger",
                env.ledger,
                "--signing-key",
                str(b / "release.key"),
                "--listen",
                "0.0.0.0:50061",
            ],
        ),
        (
            "release-service datasets plaintext off loopback",
            ["release-service", "datasets", "--service", "192.0.2.1:50061"],
        ),
        (
            "release count --service plaintext off loopback",
            [*ask("count"), "--service", "192.0.2.1:50061", "--dataset", "d"],
        ),
        (
            "release count --embedded --insecure",
            [*ask("count"), "--embedded", "--dataset", "d", "--insecure"],
        ),
        (
            "release-service sign-policy malformed",
            [
                "release-service",
                "sign-policy",
                str(b / "bad.toml"),
                "--key",
                str(b / "release.key"),
                "--out",
                str(b / "signed.json"),
            ],
        ),
        ("release-service consolidate no ledger", _consolidate(env)),
        ("unknown command", ["no-such-command"]),
        ("unknown option", ["ledger", "show", "x", "--no-such-option"]),
        *_range_cases(env),
        *_shuffle_cases(env),
    ]
    return out


def _range_cases(env: Env) -> list[tuple[str, list[str]]]:
    """Out-of-range numbers and malformed decimals refused before anything runs (issue 29,
    item 3: these exited 70 or 0, or dialed the service first)."""
    b = str(env.base)
    return [
        (
            "keys rotate negative threshold",
            [
                *("keys", "rotate", "--current", f"{b}/data.txt", "--sign", f"{b}/release.key"),
                *("--out", f"{b}/never-root.json", "--threshold", "-1"),
            ],
        ),
        ("client outbox negative limit", ["client", "outbox", "--state-dir", b, "--limit", "-5"]),
        ("client events negative limit", ["client", "events", "--state-dir", b, "--limit", "-5"]),
        ("client budget negative now", ["client", "budget", "--state-dir", b, "--now", "-100"]),
        (
            "release-service query exponent epsilon",
            [
                *("release-service", "query", "count", "--service", "192.0.2.1:9", "--insecure"),
                *("--dataset", "d", "--purpose", "p", "--epsilon", "1e-3", "--key", "k"),
            ],
        ),
    ]


def _service_job(b: Path) -> list[str]:
    """A complete `fedldp train --service` job (to an address nothing listens on)."""
    return [
        "train",
        "--service=127.0.0.1:1",
        "--dataset=d",
        "--purpose=p",
        "--epsilon=1",
        "--delta=0.00001",
        "--model=m",
        "--label=l",
        "--epochs=1",
        "--expected-batch-size=8",
        "--learning-rate=0.1",
        "--max-grad-norm=1",
        "--key=k",
        f"--out={b / 'no-train-out'}",
    ]


# Cases whose message or exit code is checked beyond "one error line, exit 1 or 2".
EXPECTED: dict[str, tuple[int, str]] = {
    "ledger set-cap exponent": (2, "plain notation"),
    "release count exponent": (2, "plain notation"),
    "demo exponent epsilon": (2, "plain notation"),
    "demo unknown scenario": (2, "--scenario"),
    "demo open-domain exponent epsilon": (2, "plain notation"),
    "verify mechanism max-bytes 0": (2, "--max-bytes"),
    "verify mechanism pem bad g": (2, "power of two"),
    "train nproc zero": (2, "--nproc"),
    "release count --service no dataset": (2, "--service needs --dataset"),
    "release sum --service with --lower": (2, "--lower is not used with --service"),
    "release mean --service no token": (1, "FEDLDP_TOKEN"),
    "release histogram --embedded no catalog": (2, "--embedded needs --catalog"),
    "release quantile --dataset without a service": (2, "--dataset needs --service"),
    "release quantile local no --quantile": (2, "--quantile"),
    "release quantile exponent": (2, "plain notation"),
    "release choice local no candidates": (2, "--candidates"),
    "release-service query quantile no --quantile": (2, "--quantile"),
    "release-service serve unsigned policy": (1, "is not signed"),
    "release-service sign-policy malformed": (1, "cannot read release policy"),
    "release-service serve --mtls without --tls-cert": (2, "--mtls needs --tls-cert"),
    "release-service serve --tls-client-ca without --mtls": (2, "only used with --mtls"),
    "release-service serve plaintext off loopback": (2, "not a loopback address"),
    "release-service datasets plaintext off loopback": (2, "--insecure"),
    "release count --service plaintext off loopback": (2, "--insecure"),
    "release count --embedded --insecure": (2, "--insecure is not used with --embedded"),
    "mint-token negative ttl": (2, "--ttl"),
    "collector serve --config nonhex": (1, "nonhex.secret"),
    "collector serve --config malformed-toml": (1, "bad.toml"),
    "collector serve --config badlisten": (1, "listen"),
    "report unknown policy": (1, "no signed policy 'no.such'"),
    "report sketch without --candidates": (2, "pass --candidates FILE"),
    "report --candidates categorical": (2, "applies to sketch policies"),
    "report --candidates missing": (2, "nope.txt"),
    "report --candidates too long": (1, "candidate 2: an open-domain value is longer than"),
    "report --candidates not utf-8": (1, "not UTF-8 text"),
    "report --candidates empty": (1, "no candidate strings"),
    "report sketch with consistency": (1, "needs a complete domain"),
    "report wrong audience": (1, "audience"),
    "ledger show --ledger missing-file": (1, "does not exist"),
    "ledger show --ledger unreachable-postgres": (1, "ledger"),
    "release spend --ledger missing-file": (1, "does not exist"),
    "policy show empty file": (1, "empty"),
    "mint-token non-hex secret file": (1, "nonhex.secret"),
    "mint-token unknown audience": (2, "--audience"),
    "report --config malformed-toml": (1, "bad.toml is not valid TOML"),
    "unknown option": (2, "No such option"),
    "ledger shards show without --config": (2, "--config"),
    "ledger shards add without --new": (2, "--new"),
    "ledger shards add itself": (1, "a shard already"),
    "ledger shards add unreachable": (1, "ledger"),
    "collector serve --config both": (1, "set ledger_url or ledger_shards, not both"),
    "ledger show --ledger restore-incomplete": (1, "never recorded its restore epoch"),
    "ledger migrate --ledger restore-incomplete": (1, "never recorded its restore epoch"),
    "ledger backup --ledger restore-incomplete": (1, "never recorded its restore epoch"),
    "collector serve --config incomplete": (1, "never recorded its restore epoch"),
    "release count --ledger in-memory": (1, "durable SQLite file"),
    "ledger restore a backup that is not a database": (1, "junk.db is not a SQLite ledger"),
    "train neither config nor service": (2, "--config"),
    "train service missing job options": (2, "needs --dataset"),
    "train service exponent epsilon": (2, "plain notation"),
    "train service without token": (1, "FEDLDP_TOKEN"),
    "train service with config": (2, "local run"),
    "train status without service": (2, "--service"),
    "ledger show --ledger shard-1": (1, "is shard 1 of 2"),
    "ledger reconcile --ledger shard-1": (1, "is shard 1 of 2"),
    "report --ledger shard-1": (1, "is shard 1 of 2"),
    "ledger set-cap --ledger shard-1": (1, "central caps and reservations live on shard 0"),
    "release spend --ledger shard-1": (1, "central caps and reservations live on shard 0"),
    "ledger confirm-central --ledger shard-1": (1, "live on shard 0"),
    "ledger reservations --ledger shard-1": (1, "live on shard 0"),
    "ledger settle-stale --ledger shard-1": (1, "live on shard 0"),
    "ledger show --config stale-shards": (1, "1 shard URL(s) given"),
    "ledger reconcile --config stale-shards": (1, "1 shard URL(s) given"),
    "report --config stale-shards": (1, "1 shard URL(s) given"),
    "ledger show --config shard1": (1, "is shard 1 of 2"),
    "ledger reconcile --config shard1": (1, "is shard 1 of 2"),
    "report --config shard1": (1, "is shard 1 of 2"),
    "release-service consolidate --ledger shard-1": (1, "is shard 1 of 2"),
    "release-service consolidate --config stale-shards": (1, "1 shard URL(s) given"),
    "release-service consolidate --config shard1": (1, "is shard 1 of 2"),
    "release-service consolidate --ledger missing-file": (1, "does not exist"),
    "release-service consolidate no ledger": (2, "pass --ledger URL or --config FILE"),
    "dashboard --ledger shard-1": (1, "is shard 1 of 2"),
    "dashboard --ledger missing-file": (1, "does not exist"),
    "collector serve --config charged-shards": (1, "already holds charges"),
    "keys rotate negative threshold": (2, "--threshold"),
    "client outbox negative limit": (2, "--limit"),
    "client events negative limit": (2, "--limit"),
    "client budget negative now": (2, "--now"),
    "release-service query exponent epsilon": (2, "plain notation"),
    "collector serve --config junkledger": (1, "is not a SQLite database"),
    "collector serve --config closedpg": (1, "ledger"),
    "collector serve --config negrate": (1, "rate_limit_per_second"),
    "collector serve --config loud": (1, "log_level"),
    "collector serve --config port70000": (1, "above 65535"),
    "collector serve --config nosecret": (1, "token_secret_file"),
    "collector serve --port-file in a missing folder": (2, "--port-file"),
    "collector health port above 65535": (2, "above 65535"),
    "shuffler serve --config malformed-toml": (1, "shuffler config: "),
    "shuffler serve --config missing": (2, "--config"),
    "shuffler serve --config collector.toml": (1, "has no [shuffler] table"),
    "shuffler serve --config missing ledger": (1, "no ledger at"),
    "shuffler serve --config bad settings": (1, "interval_seconds is a number above 0"),
    "report --batch without --analyzer-key": (2, "--batch and --analyzer-key go together"),
    "report --batch not a batch file": (1, "not a fedldp shuffled batch"),
}


def _one_line_error(line: str) -> bool:
    """`Error: ...`; `policy verify`'s REFUSED verdict; or the daemon's JSON log line at
    level ERROR (`collector serve` logs as JSON, for journald and log shippers)."""
    return line.startswith(("Error: ", "REFUSED")) or (
        line.startswith("{") and '"level": "ERROR"' in line
    )


# Commands whose start-up path is under test: run as a `fedldp` process, not in-process.
SUBPROCESS_COMMANDS = (("collector", "serve"), ("release-service", "serve"))


@dataclass(frozen=True)
class Outcome:
    """What one case printed and how it ended."""

    exit_code: int
    stderr: str
    traceback: bool  # an exception escaped (a traceback on a terminal)


def _in_subprocess(args: list[str]) -> bool:
    """Whether `args` start with one of SUBPROCESS_COMMANDS."""
    return any(tuple(args[: len(prefix)]) == prefix for prefix in SUBPROCESS_COMMANDS)


def _run(args: list[str]) -> Outcome:
    """Run `fedldp ARGS` without any FEDLDP_* variable: in-process, or as a process for
    the start-up paths."""
    names = [k for k in os.environ if k.startswith("FEDLDP_")]
    if not _in_subprocess(args):
        result = CliRunner().invoke(main, args, env=dict.fromkeys(names), catch_exceptions=True)
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        return Outcome(result.exit_code, result.stderr, escaped)
    environment = {k: v for k, v in os.environ.items() if k not in names}
    try:
        done = subprocess.run(
            [FEDLDP, *args], capture_output=True, text=True, timeout=60, env=environment
        )
    except subprocess.TimeoutExpired as exc:  # a command that should have refused at once
        return Outcome(-1, f"did not stop within 60 s: {exc}", False)
    return Outcome(done.returncode, done.stderr, "Traceback" in done.stderr)


def _problem(name: str, result: Outcome) -> str | None:
    """What is wrong with `result` for case `name` (None: nothing)."""
    if result.exit_code == 0:
        return "exit 0"
    if result.traceback or "Traceback" in result.stderr:
        return "traceback"
    if result.exit_code not in (1, 2):
        return f"exit {result.exit_code}"
    if not any(_one_line_error(line) for line in result.stderr.splitlines()):
        return "no 'Error: ' line"
    if name in EXPECTED and (
        result.exit_code != EXPECTED[name][0] or EXPECTED[name][1] not in result.stderr
    ):
        return f"expected exit {EXPECTED[name][0]} and {EXPECTED[name][1]!r}"
    if "secret@" in result.stderr:
        return "a password in the message"
    return None


def _nothing_created(env: Env) -> None:
    """Reading never writes: nothing exists where the mistyped paths pointed."""
    assert not (env.base / "absent.db").exists()
    assert not (env.base / "nope").exists()
    assert not Path("/nonexistent-fedldp").exists()
    assert not (env.base / "demo-out").exists()
    assert not (env.base / "never.bak").exists()  # a refused backup leaves nothing
    assert not (env.base / "r.db").exists()
    assert not (env.base / "never-out").exists()  # a refused `shuffler serve` starts nothing
    assert not (env.base / "spool.db").exists()
    # Nothing beside a file that is not a database (no writer or generation lock).
    assert sorted(p.name for p in env.base.glob("junk.db*")) == ["junk.db"]
    assert sorted(p.name for p in env.base.glob("*.partial")) == []


def _placeholder_env() -> Env:
    """An Env with the real one's shape, to name the cases at collection time (the
    arguments themselves are built from the real Env when a case runs)."""
    base = Path("/placeholder")
    return Env(base, base / "good.toml", "sqlite:///x", base, base, base)


CASE_NAMES = [name for name, _ in cases(_placeholder_env())]
assert len(CASE_NAMES) == len(set(CASE_NAMES)), "case names must be unique"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_bad_input_gets_one_error_line(env: Env, name: str) -> None:
    args = dict(cases(env))[name]
    result = _run(args)
    problem = _problem(name, result)
    assert problem is None, (
        f"{name}: {problem}\n  fedldp {' '.join(args)}\n  {result.stderr[-600:]}"
    )
    _nothing_created(env)
    if name == "collector serve --config charged-shards":
        # The refused first start wrote no shard map (a later `shards add` still works).
        for ledger in ("charged.db", "fresh.db"):
            with open_ledger(f"sqlite:///{env.base / ledger}", access="read") as led:
                assert read_map(led) is None


def test_the_matrix_runs_start_up_paths_as_processes() -> None:
    """The daemons' rows run as `fedldp` processes, everything else in-process."""
    matrix = cases(_placeholder_env())
    spawned = [args for _, args in matrix if _in_subprocess(args)]
    assert {args[0] for args in spawned} == {"collector", "release-service"}
    assert 0 < len(spawned) < len(matrix) // 4


_CLI_ONLY_CHILD = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing it raises ModuleNotFoundError
from click.testing import CliRunner
from fedldp.cli import main
out = []
for args in json.loads(sys.stdin.read()):
    result = CliRunner().invoke(main, args)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    out.append([args, result.exit_code, result.stderr, escaped])
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_the_matrix_with_only_the_cli_extra(env: Env) -> None:
    """With `[cli]` alone, no case is an internal error: a command that needs another
    extra says which, in one line (tests/client/test_light_install.py: the script
    without click)."""
    matrix = cases(env)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FEDLDP_")}
    done = subprocess.run(
        [sys.executable, "-c", _CLI_ONLY_CHILD.format(blocked=SERVER_MODULES)],
        input=json.dumps([args for _, args in matrix]),
        capture_output=True,
        text=True,
        timeout=280,
        env=environment,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    problems = []
    results = json.loads(done.stdout)
    assert len(results) == len(matrix)
    for args, exit_code, stderr, escaped in results:
        if escaped or exit_code not in (1, 2) or "ModuleNotFoundError" in stderr:
            problems.append(f"fedldp {' '.join(args)}: exit {exit_code}\n  {stderr[-400:]}")
        elif not any(_one_line_error(line) for line in stderr.splitlines()):
            problems.append(f"fedldp {' '.join(args)}: no 'Error: ' line\n  {stderr[-400:]}")
    assert not problems, f"{len(problems)} of {len(matrix)}:\n" + "\n".join(problems)
    _nothing_created(env)
