"""A throwaway collector deployment with one policy per kind of metric, for record.test.ts.

Usage: record_fixture.py FOLDER  (run with the repository's .venv python).
Writes FOLDER/collector.toml (SQLite ledger, loopback, port 0) and FOLDER/fixture.json:
the pinned root key, the root envelope, a bearer token for subject "device-rec" and the
metric name of each policy (categorical memoized rappor-grr and loloha, numeric hybrid,
open-domain pem, cms and hcms, multi-attribute multi-split).
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
from fedldp.v1 import policy_pb2  # noqa: E402

LABELS = ("zebra-label", "other-label", "third-label")


def main() -> None:
    """Write the deployment under the folder named on the command line."""
    base = Path(sys.argv[1])
    base.mkdir(parents=True, exist_ok=True)
    d = Deployment.create(now=int(time.time()))
    memo = policy_pb2.MEMO_CHARGING_JOINT
    for name, mechanism in (("rec.rappor", "rappor-grr"), ("rec.loloha", "loloha")):
        d.add_categorical(
            name,
            labels=LABELS,
            epsilon="1",
            epsilon_cap="10",
            mechanism=mechanism,
            params={"epsilon_permanent": "2"},
            memo_charging=memo,
        )
    d.add_numeric(
        "rec.hybrid",
        lo="-5",
        hi="5",
        epsilon="1",
        epsilon_cap="4",
        mechanism="hybrid",
        params={"levels": "16"},
    )
    d.add_open("rec.pem", max_bytes=4, epsilon="4", epsilon_cap="8", mechanism="pem")
    for mechanism in ("cms", "hcms"):
        d.add_open(
            f"rec.{mechanism}",
            max_bytes=4,
            epsilon="2",
            epsilon_cap="8",
            mechanism=mechanism,
            params={"rows": "4", "columns": "16"},
        )
    d.add_multi(
        "rec.multi",
        mechanism="multi-split",
        epsilon="2",
        epsilon_cap="8",
        attributes=[
            {"name": "kind", "values": list(LABELS), "mechanism": "grr"},
            {"name": "level", "lo": "-1", "hi": "1", "mechanism": "duchi"},
        ],
    )
    config = write_config(d, base, f"sqlite:///{base / 'ledger.db'}", "rec")
    fixture = {
        "config": str(config),
        "token": d.token("device-rec"),
        "pinned_root_keys": [raw_public_bytes(k).hex() for k in d.authority.root_public_keys],
        "root_envelope": d.authority.root_envelope.SerializeToString().hex(),
    }
    (base / "fixture.json").write_text(json.dumps(fixture), encoding="utf-8")


if __name__ == "__main__":
    main()
