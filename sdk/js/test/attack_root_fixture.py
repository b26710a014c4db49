"""Fixture of attack_root.test.ts: a root rotation that revokes a policy key.

Usage: attack_root_fixture.py  (the repository's .venv python; prints JSON)
Root v1 lists policy key P1; root v2 (signed by the same root key) lists only P2,
revoking P1. `after_rotation` is a policy (version 1) signed by P2;
`revoked` is the next version of the same policy signed by the revoked P1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from fedldp.client.policy.envelope import raw_public_bytes

from authoring.authority import Authority
from authoring.signing import generate_key, make_root, sign_policy


def main() -> None:
    """Print the fixture as JSON."""
    now = int(time.time())
    authority = Authority.generate(now=now - 3600)
    p2 = generate_key()
    expires = now + 86400 * 30
    root_v2 = make_root(
        version=2,
        root_keys=[authority.root_key],
        policy_keys=[(p2.public_key(), expires)],
        expires_at=expires,
        signers=[authority.root_key],
    )

    def policy(version: int) -> object:
        return authority.categorical_policy(
            policy_id="atk.root",
            metric="metric.atk_root",
            labels=["a", "b", "c", "d"],
            epsilon="0.5",
            epsilon_cap="2",
            window_seconds=86400,
            now=now - 60,
            version=version,
        )

    out = {
        "now": now,
        "pinned_root_keys": [raw_public_bytes(authority.root_key.public_key()).hex()],
        "root_v1": authority.root_envelope.SerializeToString().hex(),
        "root_v2": root_v2.SerializeToString().hex(),
        "after_rotation": sign_policy(policy(1), p2).SerializeToString().hex(),
        "revoked": sign_policy(policy(2), authority.policy_key).SerializeToString().hex(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
