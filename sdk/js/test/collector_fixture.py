"""Set up a throwaway collector deployment for the Node integration test.

Usage: collector_fixture.py FOLDER  (run with the repository's .venv python).
Writes FOLDER/collector.toml (SQLite ledger, loopback, port 0) with the trust and
policy folders and FOLDER/fixture.json: the pinned root key, the root envelope,
a bearer token for subject "device-js" and the metric names with their policies.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))

from collector_testkit import Deployment, write_config  # noqa: E402
from fedldp.client.policy.envelope import raw_public_bytes  # noqa: E402


def main() -> None:
    """Write the deployment under the folder named on the command line."""
    base = Path(sys.argv[1])
    base.mkdir(parents=True, exist_ok=True)
    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical("js.grr", epsilon="0.5", epsilon_cap="2", mechanism="grr")
    deployment.add_categorical("js.olh", epsilon="1", epsilon_cap="3", mechanism="olh")
    deployment.add_categorical("js.oue", epsilon="0.75", epsilon_cap="3", mechanism="oue")
    authority = deployment.authority
    config = write_config(deployment, base, f"sqlite:///{base / 'ledger.db'}", "js")
    fixture = {
        "config": str(config),
        "token": deployment.token("device-js"),
        "pinned_root_keys": [raw_public_bytes(k).hex() for k in authority.root_public_keys],
        "root_envelope": deployment.authority.root_envelope.SerializeToString().hex(),
        "metrics": {"grr": "metric.js_grr", "olh": "metric.js_olh", "oue": "metric.js_oue"},
    }
    (base / "fixture.json").write_text(json.dumps(fixture), encoding="utf-8")


if __name__ == "__main__":
    main()
