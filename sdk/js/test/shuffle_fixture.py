"""Set up a throwaway shuffle-model deployment for the Node shuffle test (shuffle.test.ts).

Usage: shuffle_fixture.py FOLDER [ORIGIN ...]  (run with the repository's .venv python;
with ORIGINs the web endpoint is on: web_listen port 0, those origins allowed).
Runs `fedldp shuffler keygen --out FOLDER/keys`, then writes FOLDER/collector.toml (SQLite
ledger, loopback, port 0) whose one policy, js.shuffle (GRR, 4 distinctive labels, ε 4,
[shuffle] with the analyzer's public key and min_batch 20), devices must seal, and
FOLDER/fixture.json: the pinned root key, the root envelope, a bearer token for subject
"device-shuffle", the metric name, the labels, the policy and trust folders, the analyzer
key file and the policy window's start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))

from collector_testkit import Deployment, write_config  # noqa: E402
from fedldp.aggregator.shuffle_analyzer import load_public_key  # noqa: E402
from fedldp.client.policy.envelope import raw_public_bytes  # noqa: E402

LABELS = (
    "sealed-label-north-5b1e",
    "sealed-label-south-0c7d",
    "sealed-label-east-93aa",
    "sealed-label-west-2f60",
)
WINDOW_SECONDS = 86400


def main() -> None:
    """Write the deployment under the folder named on the command line."""
    base = Path(sys.argv[1])
    base.mkdir(parents=True, exist_ok=True)
    fedldp = Path(sys.executable).parent / "fedldp"
    subprocess.run(
        [str(fedldp), "shuffler", "keygen", "--out", str(base / "keys")],
        check=True,
        capture_output=True,
    )
    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical(
        "js.shuffle",
        epsilon="4",
        epsilon_cap="1000",
        mechanism="grr",
        labels=LABELS,
        window_seconds=WINDOW_SECONDS,
        analyzer_key=load_public_key(base / "keys" / "analyzer.pub"),
        min_batch=20,
    )
    origins = sys.argv[2:]
    web = {"web_listen": "127.0.0.1:0", "web_allowed_origins": origins} if origins else {}
    config = write_config(deployment, base, f"sqlite:///{base / 'ledger.db'}", "js-shuffle", **web)
    fixture = {
        "config": str(config),
        "token": deployment.token("device-shuffle"),
        "labels": list(LABELS),
        "metric": "metric.js_shuffle",
        "pinned_root_keys": [
            raw_public_bytes(k).hex() for k in deployment.authority.root_public_keys
        ],
        "root_envelope": deployment.authority.root_envelope.SerializeToString().hex(),
        "policies": str(base / "policies"),
        "trust": str(base / "trust"),
        "analyzer_key": str(base / "keys" / "analyzer.key"),
        "window": now - now % WINDOW_SECONDS,
    }
    (base / "fixture.json").write_text(json.dumps(fixture), encoding="utf-8")


if __name__ == "__main__":
    main()
