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
at most m reports in the batch has (m·ε, δ·Σ_{i<m} e^{iε}) by group privacy (Dwork & Roth 2014,
Theorem 2.2), which the printed line states too.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
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
    max_reports_per_device: int = 1

    def guarantee_line(self) -> str:
        """One line stating the local and the central guarantee, per report and per device.

        Every printed ε and δ is rounded up, never below the certified value. The per-device
        guarantee is group privacy over the device's at most m reports (`per_device`).
        """
        local = f"local ε0 = {self.epsilon0:g} per report"
        if self.central is None:
            return f"{local}; no valid report, no central guarantee"
        c = self.central
        m = self.max_reports_per_device
        eps_m, delta_m = per_device(c.epsilon, c.delta, m)
        device = f"({round_up(eps_m)}, {_round_up_sig(delta_m)})" if delta_m < 1 else "none (δ ≥ 1)"
        return (
            f"{local}; shuffled central (ε, δ) = ({round_up(c.epsilon)}, {c.delta:g}) per "
            f"report over n = {c.n} reports [{c.bound}]; per device (at most {m} reports "
            f"in the batch, group privacy): {device}"
        )

    def guarantee_dict(
        self,
        collector_count: int | None = None,
        source: str | None = None,
        *,
        epsilon0: Decimal | None = None,
    ) -> dict[str, Any]:
        """The guarantees as JSON-ready values (every ε and δ a string rounded up, as printed).

        `collector_count` and `source` say which count capped n ("manifest" beside the batch
        file, "--collector-count", or None). `epsilon0`: the policy's exact ε0 (a decimal,
        printed as is, and m·ε0 exactly); without it the float is printed. Keys: batch,
        valid_reports, invalid (reason -> count), epsilon0 (local, per report),
        local_epsilon_per_device (m·ε0), n, delta, central_epsilon, bound,
        max_reports_per_device (m), device_epsilon and device_delta (group privacy;
        device_delta None when vacuous), collector_count, collector_count_source. Without a
        valid report the central and device fields are None.
        """
        m = self.max_reports_per_device
        out: dict[str, Any] = {
            "batch": self.batch,
            "valid_reports": self.accepted,
            "invalid": dict(sorted(self.invalid.items())),
            "epsilon0": f"{self.epsilon0!r}" if epsilon0 is None else str(epsilon0),
            "local_epsilon_per_device": (
                f"{m * self.epsilon0!r}" if epsilon0 is None else str(m * epsilon0)
            ),
            "max_reports_per_device": m,
            "collector_count": collector_count,
            "collector_count_source": source,
            "n": None,
            "delta": None,
            "central_epsilon": None,
            "bound": None,
            "device_epsilon": None,
            "device_delta": None,
        }
        if self.central is not None:
            c = self.central
            eps_m, delta_m = per_device(c.epsilon, c.delta, m)
            out.update(
                n=c.n,
                delta=f"{c.delta:g}",
                central_epsilon=round_up(c.epsilon),
                bound=c.bound,
                device_epsilon=round_up(eps_m),
                device_delta=_round_up_sig(delta_m) if delta_m < 1 else None,
            )
        return out


def per_device(epsilon: float, delta: float, m: int) -> tuple[float, float]:
    """The guarantee of a device with at most m reports in a batch whose every report has
    (ε, δ): (m·ε, δ·Σ_{i<m} e^{iε}), group privacy for (ε, δ)-DP (Dwork & Roth, "The
    Algorithmic Foundations of Differential Privacy", 2014, Theorem 2.2 and its (ε, δ) form:
    neighbouring batches differ in the m reports of one device).

    Raises ValueError when m < 1."""
    if m < 1:
        raise ValueError("a device has at least one report")
    if m == 1:
        return epsilon, delta
    if epsilon <= 0:
        return 0.0, min(1.0, delta * m)
    # Σ_{i<m} e^{iε} = (e^{mε} − 1) / (e^ε − 1), in logs (m·ε may overflow a float's exp);
    # the factor 1 + 1e-12 covers the floating-point error, so the result is not below it.
    log_sum = m * epsilon + math.log(-math.expm1(-m * epsilon)) - math.log(math.expm1(epsilon))
    log_delta = math.log(delta) + log_sum + math.log1p(1e-12)
    return m * epsilon, 1.0 if log_delta >= 0 else math.exp(log_delta)


def _round_up_sig(value: float, digits: int = 3) -> str:
    """`value` rounded up to `digits` significant digits, printed (for a δ)."""
    from decimal import ROUND_CEILING, Decimal

    exact = Decimal(value)
    if exact == 0:
        return "0"
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return f"{exact.quantize(step, rounding=ROUND_CEILING):E}".replace("E", "e")


def round_up(value: float, places: int = 4) -> str:
    """`value` rounded up (toward +∞) to `places` decimals: a printed ε is never below the
    certified one. Exact: the float is converted to Decimal without loss before rounding."""
    from decimal import ROUND_CEILING, Decimal

    return str(Decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_CEILING))


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
    max_reports_per_device: int = 1,
) -> ShuffledRelease:
    """Open, check and accumulate every ciphertext of the shuffled batch at `path`.

    `mechanism` is the policy's mechanism (its `check_output`, `new_statistic`, `accumulate`
    and `epsilon` are used); `info` is `fedldp.client.sealed.seal_info` of the policy.
    `collector_count`, the number of reports the collector accepted (authenticated, charged)
    for the batch, caps the n of the central guarantee: reports a shuffler added on its own
    hide nobody (docs/shuffle.md). `max_reports_per_device` (m, the policy's per-window cap ÷
    the charge per report) gives the printed per-device guarantee. A ciphertext repeated in
    the batch is opened once; each repeat is dropped and counted as "DUPLICATE".
    """
    batch, ciphertexts = read_batch(path)
    statistic = mechanism.new_statistic()
    invalid: Counter[str] = Counter()
    accepted = 0
    seen: set[bytes] = set()
    for ciphertext in ciphertexts:
        if ciphertext in seen:  # HPKE output never repeats honestly: a replay counts once
            invalid["DUPLICATE"] += 1
            continue
        seen.add(ciphertext)
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
    return ShuffledRelease(
        batch, statistic, accepted, epsilon0, central, dict(invalid), max_reports_per_device
    )
