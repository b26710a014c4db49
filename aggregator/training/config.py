"""Training configuration: parsed and validated before anything else runs.

A `TrainConfig` can only be built valid (STYLE.md §3): every check that does not
need the data happens in the constructors here, so a bad file changes nothing —
no ledger reservation, no data read, no artifact. This module imports neither
torch nor Opacus, so `fedldp train` can reject a bad config without the `train`
extra's start-up cost.

The TOML layout (see deploy/examples/train.toml)::

    [budget]    ledger, subject, purpose, epsilon, delta, idempotency_key
    [data]      source, path | url + table, label, features, num_classes, rows,
                privacy_unit, unit_column
    [model]     kind, hidden, activation, norm, fix_model
    [training]  epochs, max_grad_norm, expected_batch_size | sample_rate, learning_rate,
                optimizer, momentum, noise_multiplier, grad_sample_mode, check_every_steps
    [accountant] kind, fallback_to_rdp, eps_error
    [randomness] source, seed
    [output]    dir
    [receipt]   signing_key, passphrase_env, data_digest_key
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from fedldp.client.decimals import DecimalSyntaxError, parse_decimal
from fedldp.client.textfiles import read_utf8


def _toml_loads(text: str) -> dict[str, Any]:
    # tomllib on 3.11+, tomli (a dependency of the collector extra) on 3.10.
    module = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    loaded: dict[str, Any] = module.loads(text)
    return loaded


ACCOUNTANTS = ("prv", "rdp")
GRAD_SAMPLE_MODES = ("auto", "hooks", "ghost", "functorch", "ew")
DATA_SOURCES = ("csv", "parquet", "sql")
OPTIMIZERS = ("sgd", "adam")
ACTIVATIONS = ("relu", "tanh")
NORMS = ("none", "batch", "group", "layer")
NOISE_SOURCES = ("os-entropy", "seeded")
# Keys that describe a fixed-batch, shuffled or otherwise non-Poisson loader: the
# accountants assume Poisson subsampling (Mironov, Talwar, Zhang 2019, "Rényi
# Differential Privacy of the Sampled Gaussian Mechanism", §3; Gopi, Lee, Wutschitz
# 2021, "Numerical Composition of Differential Privacy", §5), so these are refused.
NON_POISSON_KEYS = ("batch_size", "shuffle", "drop_last", "sampler", "poisson_sampling")


class TrainingConfigError(ValueError):
    """The training configuration is invalid; nothing was reserved, read or written."""


def _table(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, Mapping):
        raise TrainingConfigError(f"[{name}] must be a table")
    return dict(value)


def _no_unknown(section: str, table: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise TrainingConfigError(f"[{section}] has unknown keys: {', '.join(unknown)}")


def _decimal(section: str, key: str, value: object) -> Decimal:
    """An exact decimal from a TOML string in plain notation or a TOML integer.

    The one rule of fedldp.client.decimals (policy.proto rule 6): "0.00001", not
    "1e-5"; TOML floats are refused (inexact).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TrainingConfigError(
            f'[{section}] {key} must be a decimal string such as "3" or "0.00001" '
            "(a TOML float is inexact)"
        )
    try:
        return parse_decimal(str(value).strip(), allow_negative=True, name=f"[{section}] {key}")
    except DecimalSyntaxError as exc:
        raise TrainingConfigError(str(exc)) from None


def _positive_float(section: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TrainingConfigError(f"[{section}] {key} must be a number")
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise TrainingConfigError(f"[{section}] {key} must be finite and > 0")
    return out


def _positive_int(section: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainingConfigError(f"[{section}] {key} must be an integer >= 1")
    return value


def _choice(section: str, key: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise TrainingConfigError(f"[{section}] {key} must be one of {', '.join(choices)}")
    return str(value)


def _text(section: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TrainingConfigError(f"[{section}] {key} must be a non-empty string")
    return value


@dataclass(frozen=True)
class BudgetConfig:
    """What to reserve in the ledger, for which subject and purpose.

    `epsilon` and `delta` are the run's whole budget: the reservation, the
    calibration target and the ceiling the run stops under. The ledger's cap for
    (subject, purpose) is set by an operator, never here.
    """

    ledger: str
    subject: str
    purpose: str
    epsilon: Decimal
    delta: Decimal
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        _text("budget", "ledger", self.ledger)
        _text("budget", "subject", self.subject)
        _text("budget", "purpose", self.purpose)
        if not self.epsilon.is_finite() or self.epsilon <= 0:
            raise TrainingConfigError("[budget] epsilon must be finite and > 0")
        if not self.delta.is_finite() or not 0 < self.delta < 1:
            raise TrainingConfigError("[budget] delta must satisfy 0 < delta < 1")
        if self.idempotency_key is not None:
            _text("budget", "idempotency_key", self.idempotency_key)


@dataclass(frozen=True)
class DataConfig:
    """Where the training table is and how to read it (opened only after reservation).

    `privacy_unit` states in words what one row is (e.g. "one patient"): DP-SGD
    here protects one row; when `unit_column` names a column, the run checks that
    each unit occupies at most one row and refuses otherwise.

    Schema that a training run publishes comes from here, never from the data
    (docs/training.md, "The DP unit"): `features` (the feature columns),
    `num_classes` (labels must lie in 0..num_classes-1; a label outside fails
    the read, charged) and `rows`, the *declared* public population size that
    fixes q = expected_batch_size / rows and the loss divisor; the actual row
    count is never published. A training config needs all three
    (TrainConfig); reading a table for verification does not.
    """

    source: str
    label: str
    privacy_unit: str
    path: str | None = None
    url: str | None = None
    table: str | None = None
    features: tuple[str, ...] | None = None
    unit_column: str | None = None
    num_classes: int | None = None
    rows: int | None = None

    def __post_init__(self) -> None:
        _choice("data", "source", self.source, DATA_SOURCES)
        if (
            self.num_classes is not None
            and _positive_int("data", "num_classes", self.num_classes) < 2
        ):
            raise TrainingConfigError("[data] num_classes must be an integer >= 2")
        if self.rows is not None:
            _positive_int("data", "rows", self.rows)
        _text("data", "label", self.label)
        _text("data", "privacy_unit", self.privacy_unit)
        if self.source in ("csv", "parquet"):
            if not self.path:
                raise TrainingConfigError(f"[data] source {self.source!r} needs path")
            if self.url or self.table:
                raise TrainingConfigError("[data] url/table are for source 'sql' only")
        else:
            if not self.url or not self.table:
                raise TrainingConfigError("[data] source 'sql' needs url and table")
            if self.path:
                raise TrainingConfigError("[data] path is for csv/parquet sources only")
        if self.features is not None:
            if not self.features or len(set(self.features)) != len(self.features):
                raise TrainingConfigError(
                    "[data] features must be a non-empty list of distinct names"
                )
            if self.label in self.features:
                raise TrainingConfigError("[data] the label column cannot be a feature")
            if self.unit_column is not None and self.unit_column in self.features:
                raise TrainingConfigError("[data] the unit column cannot be a feature")


@dataclass(frozen=True)
class ModelConfig:
    """The built-in tabular model: an MLP (any nn.Module through the Python API)."""

    kind: str = "mlp"
    hidden: tuple[int, ...] = (64,)
    activation: str = "relu"
    norm: str = "none"
    fix_model: bool = False

    def __post_init__(self) -> None:
        _choice("model", "kind", self.kind, ("mlp",))
        for width in self.hidden:
            _positive_int("model", "hidden[]", width)
        _choice("model", "activation", self.activation, ACTIVATIONS)
        _choice("model", "norm", self.norm, NORMS)


@dataclass(frozen=True)
class TrainingParams:
    """DP-SGD hyperparameters.

    Exactly one of `expected_batch_size` and `sample_rate` fixes the Poisson
    sampling rate q (q = expected_batch_size / [data] rows, the declared
    population size: never the data's own row count). When
    `noise_multiplier` is None it is calibrated so that `epochs` epochs of
    ⌊epochs/q⌋ steps land within the budget; when given, the run stops at the
    step limit the budget allows, whatever `epochs` says.
    """

    epochs: int
    max_grad_norm: float
    learning_rate: float
    expected_batch_size: int | None = None
    sample_rate: float | None = None
    optimizer: str = "sgd"
    momentum: float = 0.0
    noise_multiplier: float | None = None
    grad_sample_mode: str = "auto"
    check_every_steps: int | None = None

    def __post_init__(self) -> None:
        _positive_int("training", "epochs", self.epochs)
        _positive_float("training", "max_grad_norm", self.max_grad_norm)
        _positive_float("training", "learning_rate", self.learning_rate)
        if (self.expected_batch_size is None) == (self.sample_rate is None):
            raise TrainingConfigError(
                "[training] set exactly one of expected_batch_size and sample_rate"
            )
        if self.expected_batch_size is not None:
            _positive_int("training", "expected_batch_size", self.expected_batch_size)
        if self.sample_rate is not None:
            rate = _positive_float("training", "sample_rate", self.sample_rate)
            if rate > 1:
                raise TrainingConfigError("[training] sample_rate must be in (0, 1]")
        _choice("training", "optimizer", self.optimizer, OPTIMIZERS)
        if not math.isfinite(self.momentum) or not 0 <= self.momentum < 1:
            raise TrainingConfigError("[training] momentum must be in [0, 1)")
        if self.noise_multiplier is not None:
            _positive_float("training", "noise_multiplier", self.noise_multiplier)
        _choice("training", "grad_sample_mode", self.grad_sample_mode, GRAD_SAMPLE_MODES)
        if self.check_every_steps is not None:
            _positive_int("training", "check_every_steps", self.check_every_steps)


@dataclass(frozen=True)
class AccountantConfig:
    """Which accountant bounds the run (PRV by default) and whether RDP may stand in.

    PRV: Gopi, Lee, Wutschitz 2021, "Numerical Composition of Differential
    Privacy" (eps_error is its ε-accuracy parameter, §5). RDP: Mironov 2017, with
    the sampled Gaussian analysis of Mironov, Talwar, Zhang 2019. RDP's bound is
    valid but looser; it replaces a failed PRV only when `fallback_to_rdp` is true.
    """

    kind: str = "prv"
    fallback_to_rdp: bool = False
    eps_error: float = 0.01

    def __post_init__(self) -> None:
        _choice("accountant", "kind", self.kind, ACCOUNTANTS)
        if not isinstance(self.fallback_to_rdp, bool):
            raise TrainingConfigError("[accountant] fallback_to_rdp must be true or false")
        if self.fallback_to_rdp and self.kind != "prv":
            raise TrainingConfigError("[accountant] fallback_to_rdp applies to kind 'prv' only")
        eps_error = _positive_float("accountant", "eps_error", self.eps_error)
        if eps_error > 1:
            raise TrainingConfigError("[accountant] eps_error must be <= 1")


@dataclass(frozen=True)
class RandomnessConfig:
    """Where sampling and noise randomness comes from (see noise.py).

    `os-entropy` (default) reseeds the sampling and noise generators from the
    OS CSPRNG before every step. `seeded` makes a run reproducible from `seed`:
    for tests only; such a run's receipt says so and it gives no privacy
    against anyone who can learn the seed.
    """

    source: str = "os-entropy"
    seed: int | None = None

    def __post_init__(self) -> None:
        _choice("randomness", "source", self.source, NOISE_SOURCES)
        if self.source == "seeded":
            if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
                raise TrainingConfigError("[randomness] source 'seeded' needs seed = integer >= 0")
        elif self.seed is not None:
            raise TrainingConfigError("[randomness] seed is allowed only with source 'seeded'")


@dataclass(frozen=True)
class ReceiptConfig:
    """How the receipt is signed: `signing_key` is an Ed25519 PEM private key file (from
    `fedldp keys generate`), decrypted with the passphrase in environment variable
    `passphrase_env` when set. Without a key the receipt is written unsigned, and
    `fedldp verify training` refuses it. `data_digest_key` is the secret
    data-digest key file (`fedldp keys data-key`): the receipt and the ledger
    bind the dataset only by an HMAC under it (aggregator/central/datakey.py);
    without it they record no data digest at all."""

    signing_key: str | None = None
    passphrase_env: str | None = None
    data_digest_key: str | None = None


@dataclass(frozen=True)
class TrainConfig:
    """The whole, validated, training configuration."""

    budget: BudgetConfig
    data: DataConfig
    training: TrainingParams
    output_dir: Path
    model: ModelConfig = field(default_factory=ModelConfig)
    accountant: AccountantConfig = field(default_factory=AccountantConfig)
    randomness: RandomnessConfig = field(default_factory=RandomnessConfig)
    receipt: ReceiptConfig = field(default_factory=ReceiptConfig)

    def __post_init__(self) -> None:
        for key in ("features", "num_classes", "rows"):
            if getattr(self.data, key) is None:
                raise TrainingConfigError(
                    f"[data] {key} is required: the released model's shape and the sampling "
                    "rate must not come from the data (docs/training.md, The DP unit)"
                )
        batch = self.training.expected_batch_size
        if batch is not None and self.data.rows is not None and batch > self.data.rows:
            raise TrainingConfigError(
                f"[training] expected_batch_size {batch} exceeds [data] rows {self.data.rows}"
            )

    @property
    def sample_rate(self) -> float:
        """q, from the configuration alone: sample_rate, or expected_batch_size / [data] rows."""
        tp, rows = self.training, self.data.rows
        if tp.sample_rate is not None:
            return tp.sample_rate
        assert tp.expected_batch_size is not None and rows is not None  # __post_init__
        return tp.expected_batch_size / rows

    @property
    def expected_batch_size(self) -> float:
        """q · [data] rows: the loss divisor and nominal batch (never the data's count)."""
        assert self.data.rows is not None  # __post_init__
        return self.sample_rate * self.data.rows


def config_from_mapping(raw: Mapping[str, Any], *, base_dir: Path | None = None) -> TrainConfig:
    """Build a validated TrainConfig from parsed TOML; relative paths resolve against base_dir.

    Raises TrainingConfigError naming the section and key on any problem; the
    sections are checked in a fixed order (top level, budget, data, model,
    training, accountant, randomness, output, receipt), so the first problem in
    that order is the one reported.
    """
    _no_unknown(
        "top level",
        raw,
        ("budget", "data", "model", "training", "accountant", "randomness", "output", "receipt"),
    )
    base = base_dir or Path.cwd()
    budget = _budget_section(_table(raw, "budget"))
    data = _data_section(_table(raw, "data"), base)
    model = _model_section(_table(raw, "model"))
    training = _training_section(_table(raw, "training"))
    accountant = _accountant_section(_table(raw, "accountant"))
    randomness = _randomness_section(_table(raw, "randomness"))
    output_dir = _output_section(_table(raw, "output"), base)
    receipt = _receipt_section(_table(raw, "receipt"), base)
    return TrainConfig(
        budget=budget,
        data=data,
        training=training,
        output_dir=output_dir,
        model=model,
        accountant=accountant,
        randomness=randomness,
        receipt=receipt,
    )


def _resolve(base: Path, path: str) -> str:
    """`path` as an absolute path text; a relative one resolves against `base`."""
    p = Path(path)
    return str(p if p.is_absolute() else (base / p).resolve())


def _budget_section(b: Mapping[str, Any]) -> BudgetConfig:
    _no_unknown(
        "budget", b, ("ledger", "subject", "purpose", "epsilon", "delta", "idempotency_key")
    )
    for key in ("ledger", "subject", "purpose", "epsilon", "delta"):
        if key not in b:
            raise TrainingConfigError(f"[budget] {key} is required")
    return BudgetConfig(
        ledger=_text("budget", "ledger", b["ledger"]),
        subject=_text("budget", "subject", b["subject"]),
        purpose=_text("budget", "purpose", b["purpose"]),
        epsilon=_decimal("budget", "epsilon", b["epsilon"]),
        delta=_decimal("budget", "delta", b["delta"]),
        idempotency_key=b.get("idempotency_key"),
    )


def _data_section(d: Mapping[str, Any], base: Path) -> DataConfig:
    _no_unknown(
        "data",
        d,
        (
            "source",
            "path",
            "url",
            "table",
            "label",
            "features",
            "num_classes",
            "rows",
            "privacy_unit",
            "unit_column",
        ),
    )
    for key in ("source", "label", "privacy_unit"):
        if key not in d:
            raise TrainingConfigError(f"[data] {key} is required")
    features = d.get("features")
    if features is not None and (
        not isinstance(features, list) or not all(isinstance(f, str) for f in features)
    ):
        raise TrainingConfigError("[data] features must be a list of column names")
    return DataConfig(
        source=_choice("data", "source", d["source"], DATA_SOURCES),
        label=_text("data", "label", d["label"]),
        privacy_unit=_text("data", "privacy_unit", d["privacy_unit"]),
        path=_resolve(base, _text("data", "path", d["path"])) if "path" in d else None,
        url=_text("data", "url", d["url"]) if "url" in d else None,
        table=_text("data", "table", d["table"]) if "table" in d else None,
        features=tuple(features) if features is not None else None,
        unit_column=_text("data", "unit_column", d["unit_column"]) if "unit_column" in d else None,
        num_classes=d.get("num_classes"),
        rows=d.get("rows"),
    )


def _model_section(m: Mapping[str, Any]) -> ModelConfig:
    _no_unknown("model", m, ("kind", "hidden", "activation", "norm", "fix_model"))
    hidden = m.get("hidden", [64])
    if not isinstance(hidden, list):
        raise TrainingConfigError("[model] hidden must be a list of layer widths")
    fix_model = m.get("fix_model", False)
    if not isinstance(fix_model, bool):
        raise TrainingConfigError("[model] fix_model must be true or false")
    return ModelConfig(
        kind=m.get("kind", "mlp"),
        hidden=tuple(hidden),
        activation=m.get("activation", "relu"),
        norm=m.get("norm", "none"),
        fix_model=fix_model,
    )


def _training_section(t: Mapping[str, Any]) -> TrainingParams:
    refused = [k for k in NON_POISSON_KEYS if k in t]
    if refused:
        raise TrainingConfigError(
            f"[training] {', '.join(refused)}: fixed-batch or shuffled sampling conflicts with "
            "the accountant, which assumes Poisson sampling; set expected_batch_size or "
            "sample_rate instead"
        )
    _no_unknown(
        "training",
        t,
        (
            "epochs",
            "max_grad_norm",
            "learning_rate",
            "expected_batch_size",
            "sample_rate",
            "optimizer",
            "momentum",
            "noise_multiplier",
            "grad_sample_mode",
            "check_every_steps",
        ),
    )
    for key in ("epochs", "max_grad_norm", "learning_rate"):
        if key not in t:
            raise TrainingConfigError(f"[training] {key} is required")
    momentum = t.get("momentum", 0.0)
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TrainingConfigError("[training] momentum must be a number")
    sample_rate = t.get("sample_rate")
    if sample_rate is not None:
        sample_rate = _positive_float("training", "sample_rate", sample_rate)
    noise = t.get("noise_multiplier")
    if noise is not None:
        noise = _positive_float("training", "noise_multiplier", noise)
    return TrainingParams(
        epochs=t["epochs"],
        max_grad_norm=_positive_float("training", "max_grad_norm", t["max_grad_norm"]),
        learning_rate=_positive_float("training", "learning_rate", t["learning_rate"]),
        expected_batch_size=t.get("expected_batch_size"),
        sample_rate=sample_rate,
        optimizer=t.get("optimizer", "sgd"),
        momentum=float(momentum),
        noise_multiplier=noise,
        grad_sample_mode=t.get("grad_sample_mode", "auto"),
        check_every_steps=t.get("check_every_steps"),
    )


def _accountant_section(a: Mapping[str, Any]) -> AccountantConfig:
    _no_unknown("accountant", a, ("kind", "fallback_to_rdp", "eps_error"))
    return AccountantConfig(
        kind=a.get("kind", "prv"),
        fallback_to_rdp=a.get("fallback_to_rdp", False),
        eps_error=_positive_float("accountant", "eps_error", a.get("eps_error", 0.01)),
    )


def _randomness_section(r: Mapping[str, Any]) -> RandomnessConfig:
    _no_unknown("randomness", r, ("source", "seed"))
    return RandomnessConfig(source=r.get("source", "os-entropy"), seed=r.get("seed"))


def _output_section(o: Mapping[str, Any], base: Path) -> Path:
    _no_unknown("output", o, ("dir",))
    if "dir" not in o:
        raise TrainingConfigError("[output] dir is required")
    return Path(_resolve(base, _text("output", "dir", o["dir"])))


def _receipt_section(rc: Mapping[str, Any], base: Path) -> ReceiptConfig:
    _no_unknown("receipt", rc, ("signing_key", "passphrase_env", "data_digest_key"))
    return ReceiptConfig(
        signing_key=_resolve(base, _text("receipt", "signing_key", rc["signing_key"]))
        if "signing_key" in rc
        else None,
        passphrase_env=_text("receipt", "passphrase_env", rc["passphrase_env"])
        if "passphrase_env" in rc
        else None,
        data_digest_key=_resolve(base, _text("receipt", "data_digest_key", rc["data_digest_key"]))
        if "data_digest_key" in rc
        else None,
    )


def load_config(path: Path) -> TrainConfig:
    """Read and validate a train.toml; relative paths resolve against its folder."""
    try:
        text = read_utf8(
            path, "a train.toml is a UTF-8 TOML file: check --config", TrainingConfigError
        )
    except OSError as exc:
        raise TrainingConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    try:
        raw = _toml_loads(text)
    except ValueError as exc:  # TOMLDecodeError is a ValueError
        raise TrainingConfigError(f"{path} is not valid TOML: {exc}") from exc
    return config_from_mapping(raw, base_dir=path.resolve().parent)
