"""Privacy receipts: reading, replaying and checking them (`fedldp verify training`).

A receipt (schema "fedldp.training-receipt/v1", written by engine.py and
documented in docs/training.md) is canonical JSON inside a DSSE envelope signed
with the training service's Ed25519 receipt key (aggregator/central/signing.py).
`verify_receipt` runs every check and reports each with its own message:

- signature: a trusted key signed the exact payload (unsigned, untrusted or
  altered receipts fail);
- replay: the accountant history (σ, q, steps) is replayed through Opacus's PRV
  and RDP accountants; each ε must match the recorded one to REL_TOL, the ε
  of the accountant in force must be ≤ the charged ε ≤ the budget;
- ledger: the receipt names this ledger (its UUID); the reservation exists, is
  settled, has the receipt's owner, reserved and spent (ε, δ), and binds the
  key that signed the receipt (receipts.py `check_receipt_key`); the ledger's
  event holds the same accountant inputs (noise multiplier, sample rate,
  steps, δ), model digest, data digest and randomness source, and replaying
  the accountant on the LEDGER's inputs gives at most the ledger's charge;
- artifact: the model file's sha256 equals the receipt's and the ledger's;
- randomness: a seeded run is not for release (refused unless accepted);
- dataset: its canonical digest (and file sha256) match when readable
  (`--data-url` overrides a SQL URL whose password the receipt does not hold).

Compatibility: fields are only ever added; a reader ignores unknown fields and
refuses an unknown schema.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.aggregator.central.datakey import DataKey
from fedldp.aggregator.central.receipts import (
    ReceiptLedger,
    Signed,
    Verification,
    check_reservation,
)
from fedldp.aggregator.central.signing import (
    TRAINING_RECEIPT_TYPE,
    SignatureError,
    is_envelope,
    payload_of,
    verify,
)
from fedldp.client.textfiles import not_text

REL_TOL = 1e-6
SCHEMA = "fedldp.training-receipt/v1"
EVENT_KIND = "poisson_subsampled_gaussian"  # engine.EVENT_KIND, without importing torch


class ReceiptError(ValueError):
    """The receipt cannot be read or is not a fedldp training receipt."""


def load_receipt(path: Path) -> dict[str, Any]:
    """Parse a receipt (signed envelope or plain JSON) and check its schema id.

    The signature is NOT checked here (`verify_receipt` does): for tools that
    only read what the receipt says, such as the membership audit.
    """
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReceiptError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ReceiptError(f"{path} is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ReceiptError(
            f"{not_text(path, exc)}, so not a receipt: give the receipt.json a training run wrote"
        ) from None
    if is_envelope(receipt):
        try:
            receipt = payload_of(receipt)
        except SignatureError as exc:
            raise ReceiptError(f"{path}: {exc}") from exc
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
    path: Path,
    *,
    trusted: Mapping[str, Ed25519PublicKey],
    ledger: ReceiptLedger,
    accept_seeded: bool = False,
    check_data: bool = True,
    data_url: str | None = None,
    data_key: DataKey | None = None,
) -> Verification:
    """Verify the receipt at `path` (module docstring) against the trusted receipt keys
    (by key id) and the ledger; never raises on a failed check."""
    from fedldp.aggregator.training.accounting import AccountantError

    receipt = load_receipt(path)
    out = Verification()
    document = _check_signature(out, path, trusted)
    _check_ledger(out, receipt, ledger, Signed(document, TRAINING_RECEIPT_TYPE, trusted))
    _check_randomness(out, receipt, accept_seeded)
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

    _check_artifact(out, path, receipt, ledger)

    _check_dataset(out, receipt, check_data=check_data, data_url=data_url, key=data_key)
    return out


def _check_dataset(
    out: Verification,
    receipt: dict[str, Any],
    *,
    check_data: bool,
    data_url: str | None,
    key: DataKey | None,
) -> None:
    """The keyed data binding (datakey.py): needs the data and the secret data-digest key."""
    from fedldp.aggregator.central.receipts import file_sha256
    from fedldp.aggregator.training.data import DataError, load_dataset

    ds = receipt["dataset"]
    if not check_data:
        out.add("dataset", True, "not checked (--no-data)", skipped=True)
        return
    if key is None:
        out.add("dataset", True, "data binding not checked (needs --data-key)", skipped=True)
        return
    if ds.get("digest") is None:
        out.add("dataset", False, "the receipt records no data binding (trained without a key)")
        return
    if ds.get("data_key_id") != key.key_id:
        out.add("dataset", False, f"bound with data key {ds.get('data_key_id')}, not {key.key_id}")
        return
    url = data_url or ds.get("url")
    if ds["source"] == "sql" and data_url is None and url is not None and "***" in url:
        out.add("dataset", False, "the receipt's SQL URL has a hidden password; pass --data-url")
        return
    try:
        data_config = data_config_from_receipt(receipt, data_url=data_url)
        loaded = load_dataset(data_config)
    except (DataError, ValueError) as exc:
        out.add("dataset", False, f"cannot read the dataset: {exc}")
        return
    ok = key.matches("dataset", loaded.digest, ds["digest"])
    out.add(
        "dataset",
        ok,
        "the dataset matches the receipt's keyed digest"
        if ok
        else "the dataset does not match the receipt's keyed digest",
    )
    if ds.get("source_sha256") and ds.get("path"):
        raw = file_sha256(Path(ds["path"]))
        same = key.matches("file", raw, ds["source_sha256"])
        out.add("dataset file", same, "keyed digest " + ("matches" if same else "differs"))


def _check_signature(
    out: Verification, path: Path, trusted: Mapping[str, Ed25519PublicKey]
) -> dict[str, Any] | None:
    """Adds "signature"; the envelope (None: a plain JSON receipt)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if not is_envelope(document):
        out.add("signature", False, "the receipt is not signed (plain JSON, no envelope)")
        return None
    try:
        _, signer = verify(document, TRAINING_RECEIPT_TYPE, trusted)
    except SignatureError as exc:
        out.add("signature", False, str(exc))
        return dict(document)
    out.add("signature", True, f"signed by trusted receipt key {signer}")
    return dict(document)


def _ledger_event(receipt: dict[str, Any], ledger: ReceiptLedger) -> dict[str, Any] | None:
    led = receipt.get("ledger", {})
    for ev in ledger.central_events(str(led.get("subject")), str(led.get("purpose"))):
        if ev.reservation_id == led.get("reservation_id") and ev.event.get("kind") == EVENT_KIND:
            return dict(ev.event)
    return None


def _check_ledger(
    out: Verification, receipt: dict[str, Any], ledger: ReceiptLedger, signed: Signed
) -> None:
    """The receipt against the ledger: identity, reservation, amounts, owner, bound
    receipt key, inputs."""
    led, privacy, training = receipt.get("ledger", {}), receipt["privacy"], receipt["training"]
    res = check_reservation(
        out,
        led,
        ledger,
        lambda res: {
            "epsilon_budget": (privacy.get("epsilon_budget"), res.epsilon),
            "delta": (privacy.get("delta"), res.delta),
            "epsilon_spent": (privacy.get("epsilon_spent"), res.epsilon_spent),
            "delta_spent": (privacy.get("delta_spent"), res.delta_spent),
        },
        signed,
    )
    if res is None:
        return
    rid = str(led.get("reservation_id"))
    event = _ledger_event(receipt, ledger)
    if event is None:
        out.add("accountant inputs", False, f"the ledger holds no training event for {rid}")
        return
    claimed_inputs = {
        "noise_multiplier": training.get("noise_multiplier"),
        "sample_rate": training.get("sample_rate"),
        "steps": training.get("steps"),
        "delta": privacy.get("delta"),
    }
    differ = [
        f"{k} {v!r} != ledger's {event.get(k)!r}"
        for k, v in claimed_inputs.items()
        if str(v) != str(event.get(k))
    ]
    out.add(
        "accountant inputs",
        not differ,
        "noise multiplier, sample rate, steps and delta as in the ledger"
        if not differ
        else "; ".join(differ),
    )
    _replay_ledger_event(out, event, receipt, res.epsilon_spent)


def _replay_ledger_event(
    out: Verification, event: dict[str, Any], receipt: dict[str, Any], charged: Decimal | None
) -> None:
    """The accountant replayed on the ledger's own inputs must fit the ledger's charge."""
    from fedldp.aggregator.training.accounting import AccountantError, epsilon

    try:
        mech = str(event.get("accountant", "prv"))
        again = epsilon(
            mech,
            [(float(event["noise_multiplier"]), float(event["sample_rate"]), int(event["steps"]))],
            float(Decimal(str(event["delta"]))),
            eps_error=float(receipt["privacy"]["accountant"]["prv_eps_error"]),
            reference=True,
        )
    except (AccountantError, KeyError, ValueError) as exc:
        out.add("ledger replay", False, f"cannot replay the ledger's event: {exc}")
        return
    ok = charged is not None and Decimal(again) <= charged
    out.add(
        "ledger replay",
        ok,
        f"{mech} epsilon {again!r} from the ledger's inputs <= charged {charged}"
        if ok
        else f"{mech} epsilon {again!r} from the ledger's inputs exceeds the charge {charged}",
    )


def _check_randomness(out: Verification, receipt: dict[str, Any], accept_seeded: bool) -> None:
    source = receipt.get("randomness", {}).get("source")
    seeded = source != "os-entropy" or receipt.get("for_release") is not True
    if not seeded:
        out.add("randomness", True, "os-entropy: for release")
    elif accept_seeded:
        out.add("randomness", True, f"{source}: NOT for release (accepted with --accept-seeded)")
    else:
        out.add(
            "randomness",
            False,
            f"randomness {source!r}: a seeded run is not for release "
            "(pass --accept-seeded to accept it, for tests only)",
        )


def _check_artifact(
    out: Verification, path: Path, receipt: dict[str, Any], ledger: ReceiptLedger
) -> None:
    claimed = receipt["model"]["artifact_sha256"]
    artifact = path.parent / receipt["model"]["artifact"]
    if not artifact.is_file():
        out.add("artifact", False, f"{artifact} is missing")
        return
    digest = _sha256(artifact)
    event = _ledger_event(receipt, ledger) or {}
    problems = []
    if digest != claimed:
        problems.append(f"file sha256 {digest} != receipt's {claimed}")
    if event.get("model_sha256") != digest:
        problems.append(f"file sha256 {digest} != the ledger's record {event.get('model_sha256')}")
    if event.get("data_digest") != receipt["dataset"].get("digest"):
        problems.append("the receipt's data digest differs from the ledger's record")
    if event.get("randomness") != receipt.get("randomness", {}).get("source"):
        problems.append("the receipt's randomness source differs from the ledger's record")
    out.add("artifact", not problems, f"sha256 {digest}" if not problems else "; ".join(problems))


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
