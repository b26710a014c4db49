"""Set up a throwaway collector deployment for the Node integration test.

Usage: collector_fixture.py FOLDER [ORIGIN ...]  (run with the repository's .venv python).
Writes FOLDER/collector.toml (SQLite ledger, loopback, port 0) with the trust and
policy folders and FOLDER/fixture.json: the pinned root key, the root envelope,
bearer tokens for subjects "device-js", "device-web" and "device-other" and the metric names with
their policies. With ORIGINs the web endpoint is on (web_listen port 0, those
origins allowed); policy js.web's labels are distinctive strings the browser test
looks for in every request body.
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

#: Labels no request body may contain (each is distinctive, longer than any id).
WEB_LABELS = ("raw-value-apple-7f3a", "raw-value-banana-91c2", "raw-value-cherry-44d0")


def main() -> None:
    """Write the deployment under the folder named on the command line."""
    base = Path(sys.argv[1])
    base.mkdir(parents=True, exist_ok=True)
    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical("js.grr", epsilon="0.5", epsilon_cap="2", mechanism="grr")
    deployment.add_categorical("js.olh", epsilon="1", epsilon_cap="3", mechanism="olh")
    deployment.add_categorical("js.oue", epsilon="0.75", epsilon_cap="3", mechanism="oue")
    deployment.add_categorical(
        "js.web", epsilon="0.25", epsilon_cap="1000", mechanism="grr", labels=WEB_LABELS
    )
    authority = deployment.authority
    origins = sys.argv[2:]
    web = {"web_listen": "127.0.0.1:0", "web_allowed_origins": origins} if origins else {}
    config = write_config(deployment, base, f"sqlite:///{base / 'ledger.db'}", "js", **web)
    fixture = {
        "config": str(config),
        "token": deployment.token("device-js"),
        "web_token": deployment.token("device-web"),
        "other_token": deployment.token("device-other"),
        "web_labels": list(WEB_LABELS),
        "pinned_root_keys": [raw_public_bytes(k).hex() for k in authority.root_public_keys],
        "root_envelope": deployment.authority.root_envelope.SerializeToString().hex(),
        "metrics": {
            "grr": "metric.js_grr",
            "olh": "metric.js_olh",
            "oue": "metric.js_oue",
            "web": "metric.js_web",
        },
    }
    (base / "fixture.json").write_text(json.dumps(fixture), encoding="utf-8")


if __name__ == "__main__":
    main()
