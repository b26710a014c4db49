"""Privacy receipts: reading, replaying and checking them (`fedldp verify training`).

A receipt (schema "fedldp.training-receipt/v1", written by engine.py and
documented in docs/training.md) is JSON beside the model. Verification uses the
receipt alone for the privacy claim:

- the accountant history (σ, q, steps) is replayed through Opacus's PRV and RDP
  accountants with the recorded parameters, and each recomputed ε must match
  the recorded one to REL_TOL relative;
- the ε of the accountant in force must be within the budget and no more than
  the ε charged to the ledger (`epsilon_spent`);
- the model artifact's sha256 must match; the dataset's canonical digest (and
  file sha256) must match when the data is reachable (`--data-url` overrides
  a SQL URL whose password the receipt does not hold).

Compatibility: fields are only ever added; a reader ignores unknown fields and
refuses an unknown schema.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

REL_TOL = 1e-6
SCHEMA = "fedldp.training-receipt/v1"


class ReceiptError(ValueError):
    """The receipt cannot be read or is not a fedldp training receipt."""


@dataclass(frozen=True)
class Check:
    """One verification step and its outcome."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


@dataclass
class Verification:
    """All checks of one receipt; `ok` when none failed (skipped ones are listed)."""

    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if not c.skipped)

    def add(self, name: str, ok: bool, detail: str, *, skipped: bool = False) -> None:
        self.checks.append(Check(name, ok, detail, skipped))


def load_receipt(path: Path) -> dict[str, Any]:
    """Parse a receipt and check its schema id."""
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReceiptError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ReceiptError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(receipt, dict) or receipt.get("schema") != SCHEMA:
        raise ReceiptError(f"{path} is not a {SCHEMA} receipt")
    return receipt


def _rel_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0) or (a == b == 0.0)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def replay_epsilons(receipt: dict[str, Any]) -> dict[str, float]:
    """Recompute ε per accountant from the receipt's history and parameters."""
    from fedldp.aggregator.training.accounting import epsilon

    privacy = receipt["privacy"]
    history = [
        (float(s), float(q), int(t)) for s, q, t in privacy["accountant"]["state"]["history"]
    ]
    delta = float(Decimal(privacy["delta"]))
    eps_error = float(privacy["accountant"]["prv_eps_error"])
    return {
        m: epsilon(m, history, delta, eps_error=eps_error, reference=True) for m in ("prv", "rdp")
    }


def verify_receipt(
    path: Path, *, check_data: bool = True, data_url: str | None = None
) -> Verification:
    """Verify the receipt at `path` (module docstring); never raises on a failed check."""
    from fedldp.aggregator.training.accounting import AccountantError
    from fedldp.aggregator.training.data import DataError, file_sha256, load_dataset

    receipt = load_receipt(path)
    out = Verification()
    privacy = receipt["privacy"]
    used = privacy["accountant"]["used"]
    recorded = privacy["epsilon"]
    hist = privacy["accountant"]["state"]["history"]
    steps = sum(int(t) for _, _, t in hist)
    training = receipt["training"]
    consistent = steps == training["steps"] and all(
        float(s) == float(training["noise_multiplier"])
        and float(q) == float(training["sample_rate"])
        for s, q, _ in hist
    )
    out.add(
        "history",
        consistent,
        f"{len(hist)} segment(s), {steps} steps; matches training parameters"
        if consistent
        else "accountant history disagrees with the recorded steps, sigma or sample rate",
    )
    for mech in ("prv", "rdp"):
        if recorded.get(mech) is None:
            out.add(
                f"epsilon[{mech}]",
                mech != used,
                "not recorded (accountant failed at training)",
                skipped=mech != used,
            )
            continue
        try:
            from fedldp.aggregator.training.accounting import epsilon

            again = epsilon(
                mech,
                [(float(s), float(q), int(t)) for s, q, t in hist],
                float(Decimal(privacy["delta"])),
                eps_error=float(privacy["accountant"]["prv_eps_error"]),
                reference=True,  # Opacus's own accountant objects, not the cached path
            )
        except AccountantError as exc:
            out.add(f"epsilon[{mech}]", False, f"replay failed: {exc}")
            continue
        ok = _rel_close(again, float(recorded[mech]))
        out.add(
            f"epsilon[{mech}]",
            ok,
            f"replayed {again!r}, recorded {recorded[mech]!r} (rel. tol. {REL_TOL})",
        )
    eps_used = recorded.get(used)
    if eps_used is None:
        out.add("budget", False, f"no epsilon recorded for the accountant in force ({used})")
    else:
        budget = Decimal(privacy["epsilon_budget"])
        spent = Decimal(privacy["epsilon_spent"])
        ok = Decimal(float(eps_used)) <= spent <= budget
        out.add(
            "budget",
            ok,
            f"{used} epsilon {eps_used!r} <= charged {spent} <= reserved {budget}"
            if ok
            else f"{used} epsilon {eps_used!r}, charged {spent}, reserved {budget}: inconsistent",
        )

    artifact = path.parent / receipt["model"]["artifact"]
    if not artifact.is_file():
        out.add("artifact", False, f"{artifact} is missing")
    else:
        digest = _sha256(artifact)
        out.add(
            "artifact",
            digest == receipt["model"]["artifact_sha256"],
            f"sha256 {digest}"
            + (
                ""
                if digest == receipt["model"]["artifact_sha256"]
                else f" != recorded {receipt['model']['artifact_sha256']}"
            ),
        )

    ds = receipt["dataset"]
    if not check_data:
        out.add("dataset", True, "not checked (--no-data)", skipped=True)
        return out
    url = data_url or ds.get("url")
    if ds["source"] == "sql" and data_url is None and url is not None and "***" in url:
        out.add("dataset", False, "the receipt's SQL URL has a hidden password; pass --data-url")
        return out
    try:
        data_config = data_config_from_receipt(receipt, data_url=data_url)
        loaded = load_dataset(data_config)
    except (DataError, ValueError) as exc:
        out.add("dataset", False, f"cannot read the dataset: {exc}")
        return out
    ok = loaded.digest == ds["digest"] and loaded.n_rows == ds["rows"]
    out.add(
        "dataset",
        ok,
        f"digest {loaded.digest}, {loaded.n_rows} rows"
        + ("" if ok else f" != recorded {ds['digest']}, {ds['rows']} rows"),
    )
    if ds.get("source_sha256") and ds.get("path"):
        raw = file_sha256(Path(ds["path"]))
        out.add("dataset file", raw == ds["source_sha256"], f"sha256 {raw}")
    return out


def load_trained_model(receipt_path: Path) -> Any:
    """Rebuild the built-in MLP a receipt describes and load its weights (digest checked).

    Raises ReceiptError for a custom model (its class is not reconstructible from
    the receipt) or an artifact whose sha256 differs from the receipt's.
    """
    import torch
    from fedldp.aggregator.training.config import ModelConfig
    from fedldp.aggregator.training.models import build_mlp, validate_model

    receipt = load_receipt(receipt_path)
    desc = receipt["model"]
    if desc.get("kind") != "mlp":
        raise ReceiptError("only the built-in MLP can be rebuilt from a receipt")
    artifact = receipt_path.parent / desc["artifact"]
    if not artifact.is_file() or _sha256(artifact) != desc["artifact_sha256"]:
        raise ReceiptError(f"{artifact} is missing or does not match the receipt's sha256")
    config = ModelConfig(
        hidden=tuple(desc["hidden"]),
        activation=desc["activation"],
        norm=desc["norm"],
        fix_model=bool(desc["fixed"]),
    )
    model: torch.nn.Module = build_mlp(config, desc["num_features"], desc["num_classes"])
    if desc["fixed"]:
        model = validate_model(model, fix=True).module
    state = torch.load(artifact, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    model.eval()
    return model


def data_config_from_receipt(receipt: dict[str, Any], *, data_url: str | None = None) -> Any:
    """The DataConfig that reads the receipt's training table again (`data_url`
    replaces a SQL URL, whose password the receipt never holds)."""
    from fedldp.aggregator.training.config import DataConfig

    ds = receipt["dataset"]
    return DataConfig(
        source=ds["source"],
        label=ds["label"],
        privacy_unit=receipt["privacy"]["unit"],
        path=ds.get("path"),
        url=(data_url or ds.get("url")) if ds["source"] == "sql" else None,
        table=ds.get("table"),
        features=tuple(ds["features"]) if ds.get("feature_list_given") else None,
        unit_column=ds.get("unit_column"),
    )
