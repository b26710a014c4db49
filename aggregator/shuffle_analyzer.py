"""The analyzer role of the shuffle model: open a shuffled batch, drop invalid payloads, estimate.

Only the analyzer holds the private key the devices seal to (fedldp.client.sealed). It opens
each ciphertext of a shuffled batch (fedldp.aggregator.shuffler), runs the policy mechanism's own
output-domain check (the check the collector runs on plain reports: here is where the payload is
readable), counts every ciphertext that fails to open or to pass by reason and drops it, and
accumulates the rest into the mechanism's statistic. The estimate is the mechanism's own
`estimate` of that statistic: a count statistic does not depend on report order, so it equals
the estimate from the same reports unshuffled, with the same exact error bars.

The release's guarantee is printed two ways: ε0, the local guarantee every report has on its
own, and the amplified central (ε, δ) of the n valid reports after the shuffle
(fedldp.aggregator.shuffle_amplification, FMT21 Theorem 3.2). n counts valid reports only: a
payload that fails the check is no honest randomizer's output and hides nobody. The central
guarantee assumes the shuffler and the analyzer do not collude and that the n reports come from
distinct devices running the ε0 randomizer (docs/shuffle.md); it is per report, so a device with
m reports in the batch has (m·ε, m·δ) by basic composition.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedldp.aggregator.shuffle_amplification import AmplifiedGuarantee, amplified_epsilon
from fedldp.aggregator.shuffler import read_batch
from fedldp.client.mechanisms.base import OutputDomainError
from fedldp.client.sealed import open_sealed

#: δ of the printed central guarantee unless a caller names another.
DEFAULT_DELTA = 1e-8


@dataclass(frozen=True)
class ShuffledRelease:
    """What the analyzer makes of one shuffled batch.

    `statistic` is the mechanism's statistic over the `accepted` valid reports; `invalid` maps
    a rejection reason (a RejectReason name without its prefix) to how many were dropped.
    `central` is None when no report was valid.
    """

    batch: str
    statistic: Any
    accepted: int
    epsilon0: float
    central: AmplifiedGuarantee | None
    invalid: dict[str, int] = field(default_factory=dict)

    def guarantee_line(self) -> str:
        """One line stating the local and the central guarantee."""
        local = f"local ε0 = {self.epsilon0:g} per report"
        if self.central is None:
            return f"{local}; no valid report, no central guarantee"
        c = self.central
        return (
            f"{local}; shuffled central (ε, δ) = ({c.epsilon:.4f}, {c.delta:g}) over "
            f"n = {c.n} reports [{c.bound}]"
        )


def generate_analyzer_key(folder: Path) -> tuple[Path, bytes]:
    """Write a new X25519 analyzer key: `analyzer.key` (PKCS#8 PEM, mode 0600); the public key.

    The public key (32 raw bytes) is what devices seal to; it is also written, hex, to
    `analyzer.pub`. Refuses to overwrite an existing key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key_path = folder / "analyzer.key"
    key = X25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    (folder / "analyzer.pub").write_text(public.hex() + "\n")
    return key_path, public


def load_analyzer_key(path: Path) -> Any:
    """The X25519 private key in a PKCS#8 PEM file (as `generate_analyzer_key` writes it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, X25519PrivateKey):
        raise ValueError(f"{path} is not an X25519 private key")
    return key


def load_public_key(path: Path) -> bytes:
    """The 32 raw bytes of an `analyzer.pub` file (hex)."""
    raw = bytes.fromhex(Path(path).read_text().strip())
    if len(raw) != 32:
        raise ValueError(f"{path} does not hold a 32-byte X25519 public key")
    return raw


def analyze_batch(
    path: Path,
    mechanism: Any,
    private_key: Any,
    *,
    info: bytes,
    delta: float = DEFAULT_DELTA,
    collector_count: int | None = None,
) -> ShuffledRelease:
    """Open, check and accumulate every ciphertext of the shuffled batch at `path`.

    `mechanism` is the policy's mechanism (its `check_output`, `new_statistic`, `accumulate`
    and `epsilon` are used); `info` is `fedldp.client.sealed.seal_info` of the policy.
    `collector_count`, the number of reports the collector accepted (authenticated, charged)
    for the batch, caps the n of the central guarantee: reports a shuffler added on its own
    hide nobody (docs/shuffle.md).
    """
    batch, ciphertexts = read_batch(path)
    statistic = mechanism.new_statistic()
    invalid: Counter[str] = Counter()
    accepted = 0
    for ciphertext in ciphertexts:
        try:
            output = open_sealed(ciphertext, private_key, info=info)
            mechanism.check_output(output)
        except OutputDomainError as exc:
            invalid[exc.reason] += 1
            continue
        mechanism.accumulate(statistic, output)
        accepted += 1
    epsilon0 = float(mechanism.epsilon)
    n = accepted if collector_count is None else min(accepted, collector_count)
    central = amplified_epsilon(n, epsilon0, delta) if n > 0 else None
    return ShuffledRelease(batch, statistic, accepted, epsilon0, central, dict(invalid))
