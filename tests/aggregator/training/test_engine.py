"""Private training runs end to end on tiny tables with a real SQLite ledger.

Each run is a few steps on 200 rows; runs that only need "some accountant" use
RDP (fast); the replay test uses PRV, the default.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

import torch
from fedldp.aggregator.training import (
    AccountantError,
    BudgetRefusedError,
    PoissonSamplingError,
    TrainingAbortedError,
    UnsupportedModelError,
    epsilon,
    load_dataset,
    poisson_loader,
    require_poisson_loader,
    train_private,
)
from fedldp.aggregator.training.config import DataConfig, TrainingConfigError
from fedldp.aggregator.training.data import DataError, Dataset
from fedldp.aggregator.training.receipt import load_receipt
from fedldp.collector.ledger import Ledger
from torch.utils.data import DataLoader, TensorDataset

from .conftest import PURPOSE, SUBJECT

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
warnings.filterwarnings("ignore", module="opacus")

ConfigFactory = Callable[..., Any]


class CountingLoader:
    """The real loader, counting how often the data is opened."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, config: DataConfig) -> Dataset:
        self.calls += 1
        return load_dataset(config)


def _outputs(cfg: Any) -> list[Path]:
    return sorted(cfg.output_dir.glob("*")) if cfg.output_dir.exists() else []


def test_what_the_configuration_shows_is_refused_before_reserving(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    """A missing data file and an output folder that cannot be created are named
    before anything is reserved (issue 29.7): nothing is charged, nothing written."""
    counter = CountingLoader()
    missing = make_config(data={"path": str(tmp_path / "no-such.csv")})
    with pytest.raises(TrainingConfigError, match=r"\[data\] path .* is not a file"):
        train_private(missing, ledger=ledger)  # the file loader: its path is checked first
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    unwritable = make_config(output={"dir": str(blocker / "out")})
    with pytest.raises(TrainingConfigError, match=r"\[output\] folder .* cannot be created"):
        train_private(unwritable, ledger=ledger, load=counter)
    assert counter.calls == 0
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))
    assert ledger.reservations(SUBJECT) == []


def test_refused_reservation_reads_nothing_and_writes_nothing(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    never = tmp_path / "table.csv"  # exists (its path is checked first), never read
    never.write_text("not read\n")
    counter = CountingLoader()
    cfg = make_config(budget={"epsilon": "11"}, data={"path": str(never)})  # cap is 10
    with pytest.raises(BudgetRefusedError, match="exceed the cap"):
        train_private(cfg, ledger=ledger, load=counter)
    assert counter.calls == 0
    assert _outputs(cfg) == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))

    no_cap = make_config(budget={"purpose": "no-cap-set"}, data={"path": str(never)})
    with pytest.raises(BudgetRefusedError, match="no central cap"):
        train_private(no_cap, ledger=ledger, load=counter)
    assert counter.calls == 0 and never.read_text() == "not read\n"

    unreachable = make_config(budget={"ledger": f"sqlite:///{tmp_path}/missing/dir/ledger.db"})
    with pytest.raises(BudgetRefusedError, match="cannot open the ledger"):
        train_private(unreachable, load=counter)
    assert counter.calls == 0


def test_run_settles_spend_and_receipt_replays(
    make_config: ConfigFactory, ledger: Ledger, check_receipt: Callable[..., Any]
) -> None:
    counter = CountingLoader()
    cfg = make_config(accountant={"kind": "prv"}, budget={"idempotency_key": "run-1"})
    result = train_private(cfg, ledger=ledger, load=counter)
    assert counter.calls == 1
    receipt = load_receipt(result.receipt_path)
    assert receipt == result.receipt
    assert receipt["privacy"]["accountant"]["used"] == "prv"
    assert receipt["ledger"]["reservation_id"] == result.reservation_id
    assert set(receipt["privacy"]["epsilon"]) >= {"prv", "rdp"}
    # the ledger holds exactly the settled spend; the rest of the reservation is released
    eps, delta = ledger.central_spend(SUBJECT, PURPOSE)
    assert eps == result.epsilon_spent == Decimal(receipt["privacy"]["epsilon_spent"])
    assert eps <= Decimal("1") and delta == Decimal("1e-5")
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon == Decimal("1")

    check = check_receipt(result.receipt_path)
    assert check.ok, [c for c in check.checks if not c.ok]
    assert {c.name for c in check.checks} >= {
        "signature",
        "ledger identity",
        "reservation",
        "accountant inputs",
        "ledger replay",
        "epsilon[prv]",
        "epsilon[rdp]",
        "artifact",
        "randomness",
        "dataset",
    }
    # a seeded run is not for release: refused unless accepted
    refused = check_receipt(result.receipt_path, accept_seeded=False)
    assert [c.name for c in refused.checks if not c.ok] == ["randomness"]

    # a changed model file, or dataset, is caught
    signed = result.receipt_path.read_bytes()
    with result.model_path.open("ab") as fh:
        fh.write(b"\0")
    bad = check_receipt(result.receipt_path, check_data=False)
    assert [c.name for c in bad.checks if not c.ok] == ["artifact"]
    with Path(cfg.data.path).open("a") as fh:
        fh.write("0.1,0.2,0.3,0.4,1\n")
    assert "dataset" in [c.name for c in check_receipt(result.receipt_path).checks if not c.ok]
    assert result.receipt_path.read_bytes() == signed

    # the same idempotency key after settlement: refused, nothing read
    again = make_config(
        accountant={"kind": "prv"},
        budget={"idempotency_key": "run-1"},
        output={"dir": str(result.model_path.parent) + "-again"},
    )
    with pytest.raises(BudgetRefusedError, match=r"is settled.*never trains twice"):
        train_private(again, ledger=ledger, load=counter)
    assert counter.calls == 1


def test_stops_before_exceeding_the_budget(make_config: ConfigFactory, ledger: Ledger) -> None:
    # sigma fixed and far too many epochs: 100 epochs x 5 steps would overshoot
    sigma = 3.0
    cfg = make_config(training={"noise_multiplier": sigma, "epochs": 100}, budget={"epsilon": "1"})
    result = train_private(cfg, ledger=ledger)
    tr = load_receipt(result.receipt_path)["training"]
    assert result.stop_reason == "budget"
    assert 0 < result.steps == tr["step_limit"] < tr["planned_steps"] == 500
    q, delta = tr["sample_rate"], 1e-5
    at = epsilon("rdp", [(sigma, q, result.steps)], delta)
    one_more = epsilon("rdp", [(sigma, q, result.steps + 1)], delta)
    planned = epsilon("rdp", [(sigma, q, 500)], delta)
    assert at <= 1.0 < one_more  # tight: one more step would exceed
    assert planned > 1.0  # the configured run really would have overshot
    assert result.epsilon_spent <= Decimal("1")
    assert ledger.central_spend(SUBJECT, PURPOSE)[0] == result.epsilon_spent


def test_batchnorm_rejected_and_fixed_only_when_asked(
    make_config: ConfigFactory, ledger: Ledger
) -> None:
    counter = CountingLoader()
    with pytest.raises(UnsupportedModelError, match="BatchNorm"):
        train_private(make_config(model={"norm": "batch"}), ledger=ledger, load=counter)
    assert counter.calls == 0 and ledger.reservations(SUBJECT) == []

    custom = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )
    with pytest.raises(UnsupportedModelError, match="fix"):
        train_private(make_config(), ledger=ledger, model=custom, load=counter)
    assert counter.calls == 0 and ledger.reservations(SUBJECT) == []

    logs: list[str] = []
    cfg = make_config(model={"norm": "batch", "fix_model": True})
    result = train_private(cfg, ledger=ledger, log=logs.append)
    fixed = load_receipt(result.receipt_path)["model"]["fixed"]
    assert fixed and all("BatchNorm1d -> GroupNorm" in f for f in fixed)
    assert any("fixed for DP-SGD" in m for m in logs)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in result.model.modules())


def test_injected_accountant_failure_in_the_plan_is_refused_before_reserving(
    make_config: ConfigFactory,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    check_receipt: Callable[..., Any],
) -> None:
    from opacus.accountants.analysis.prv.prvs import DiscretePRV

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        # the error Opacus's PRV discretization raises on some parameters
        raise RuntimeError("Discrete mean differs significantly from continuous mean.")

    monkeypatch.setattr(DiscretePRV, "compute_epsilon", broken)
    cfg = make_config(accountant={"kind": "prv"})
    # The plan depends on the configuration alone and is made before reserving
    # (issue 29.7): an accountant that cannot plan costs nothing.
    with pytest.raises(AccountantError):
        train_private(cfg, ledger=ledger)
    assert ledger.reservations(SUBJECT, PURPOSE) == []
    assert _outputs(cfg) == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))

    # only when configured, RDP stands in, and the receipt says so
    fallback = make_config(accountant={"kind": "prv", "fallback_to_rdp": True})
    result = train_private(fallback, ledger=ledger)
    acct = load_receipt(result.receipt_path)["privacy"]["accountant"]
    assert acct["requested"] == "prv" and acct["used"] == "rdp"
    assert "Discrete mean differs" in acct["fallback_reason"]
    assert check_receipt(result.receipt_path).ok


def test_injected_opacus_failure_mid_training_aborts(
    make_config: ConfigFactory, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opacus.optimizers import DPOptimizer

    calls = {"n": 0}
    original = DPOptimizer.add_noise

    def failing(self: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected noise failure")
        original(self)

    monkeypatch.setattr(DPOptimizer, "add_noise", failing)
    cfg = make_config(training={"grad_sample_mode": "hooks"})
    with pytest.raises(TrainingAbortedError, match="injected noise failure"):
        train_private(cfg, ledger=ledger)
    assert calls["n"] == 3
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon_spent == cfg.budget.epsilon
    assert res.close_reason is not None and "RuntimeError" in res.close_reason
    assert _outputs(cfg) == []


def test_poisson_sampling_in_effect(make_config: ConfigFactory, ledger: Ledger) -> None:
    result = train_private(make_config(training={"epochs": 4}), ledger=ledger)
    tr = load_receipt(result.receipt_path)["training"]
    assert "batch_size_min" not in tr  # batch sizes sum to ~n: never published
    assert tr["expected_batch_size"] == 40 and tr["sample_rate"] == 40 / 200

    x, y = torch.zeros(50, 3), torch.zeros(50, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    loader = poisson_loader(x, y, sample_rate=0.2, generator=gen)
    require_poisson_loader(loader, 0.2)
    sizes = {int(b[1].shape[0]) for _ in range(3) for b in loader}
    assert len(sizes) > 1
    with pytest.raises(PoissonSamplingError, match="does not do Poisson sampling"):
        require_poisson_loader(DataLoader(TensorDataset(x, y), batch_size=10), 0.2)
    with pytest.raises(PoissonSamplingError, match="does not do Poisson sampling"):
        require_poisson_loader(DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True), 0.2)
    with pytest.raises(PoissonSamplingError, match="samples at rate"):
        require_poisson_loader(loader, 0.1)


def test_grad_sample_mode_is_chosen_and_reported(
    make_config: ConfigFactory, ledger: Ledger
) -> None:
    mlp = train_private(make_config(), ledger=ledger)
    mode = load_receipt(mlp.receipt_path)["training"]["grad_sample_mode"]
    assert mode["mode"] == "ghost" and "Linear" in mode["reason"]
    cfg = make_config(model={"norm": "layer"}, output={"dir": str(mlp.model_path.parent) + "-ln"})
    ln = train_private(cfg, ledger=ledger)
    mode = load_receipt(ln.receipt_path)["training"]["grad_sample_mode"]
    assert mode["mode"] in ("ghost", "hooks") and "LayerNorm" in mode["reason"]
    assert "timing probe" in mode["reason"] and "synthetic" in mode["reason"]
    assert ln.timings["probe"] > 0 and "probe" not in mlp.timings
    forced = make_config(
        training={"grad_sample_mode": "hooks"}, output={"dir": str(mlp.model_path.parent) + "-h"}
    )
    hooks = train_private(forced, ledger=ledger).receipt["training"]["grad_sample_mode"]
    assert hooks == {"mode": "hooks", "reason": "set in the configuration"}


def test_timing_probe_leaves_the_model_untouched() -> None:
    """The probe trains deep copies on synthetic data; the model's weights do not move."""
    from fedldp.aggregator.training.engine import PROBE_MODES, probe_grad_sample_mode

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    before = [p.detach().clone() for p in model.parameters()]
    mode, reason, med = probe_grad_sample_mode(
        model,
        feature_shape=(4,),
        num_classes=3,
        expected_batch_size=16,
        max_grad_norm=1.0,
        optimizer="sgd",
        learning_rate=0.5,
        momentum=0.0,
        steps=2,
    )
    assert mode in PROBE_MODES and set(med) == set(PROBE_MODES) and mode in reason
    assert med[mode] == min(med.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_sql_source_and_missing_parquet_support(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path, check_receipt: Callable[..., Any]
) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = sa.create_engine(url)
    rng = np.random.default_rng(1)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE rows (person TEXT, a REAL, b REAL, label INTEGER)"))
        for i in range(120):
            a, b = rng.normal(size=2)
            conn.execute(
                sa.text("INSERT INTO rows VALUES (:p, :a, :b, :l)"),
                {"p": f"p{i}", "a": float(a), "b": float(b), "l": int(a > b)},
            )
    engine.dispose()
    data = {
        "source": "sql",
        "path": None,
        "url": url,
        "table": "rows",
        "unit_column": "person",
        "features": ["a", "b"],
        "rows": 120,
    }
    result = train_private(make_config(data=data), ledger=ledger)
    ds = load_receipt(result.receipt_path)["dataset"]
    assert ds["declared_rows"] == 120 and ds["features"] == ["a", "b"] and ds["source"] == "sql"
    assert check_receipt(result.receipt_path).ok

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        cfg = DataConfig(
            source="parquet", label="y", privacy_unit="row", path=str(tmp_path / "t.csv")
        )
        (tmp_path / "t.csv").write_text("x,y\n1,0\n")
        with pytest.raises(DataError, match="pip install pyarrow"):
            load_dataset(cfg)


def test_repeated_unit_is_refused_and_charged(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("who,f0,label\n" + "".join(f"u{i % 5},{i / 10},{i % 2}\n" for i in range(30)))
    cfg = make_config(data={"path": str(path), "unit_column": "who", "features": ["f0"]})
    with pytest.raises(TrainingAbortedError, match="repeats a unit"):
        train_private(cfg, ledger=ledger)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled"  # found while reading: the data was opened


@pytest.mark.parametrize(
    "history",
    [
        [(1.0, 0.2, 10)],
        [(3.0, 0.05, 120)],
        [(1.0, 0.01, 300), (2.0, 0.02, 30)],
    ],
)
@pytest.mark.parametrize("mechanism", ["prv", "rdp"])
def test_cached_accountant_equals_opacus(mechanism: str, history: list[Any]) -> None:
    """The training path's cached accountant returns exactly Opacus's value."""
    assert epsilon(mechanism, history, 1e-5) == epsilon(mechanism, history, 1e-5, reference=True)


@pytest.mark.parametrize("mechanism", ["prv", "rdp"])
@pytest.mark.parametrize(("target", "rate", "steps"), [(3.0, 0.1, 50), (1.0, 0.7, 10)])
def test_calibration_lands_in_the_window(
    mechanism: str, target: float, rate: float, steps: int
) -> None:
    """σ from the GDP-guided search has ε in [target − 0.01, target], by Opacus's accountant."""
    from fedldp.aggregator.training.accounting import calibrate_noise, gdp_noise_guess

    assert gdp_noise_guess(target_epsilon=target, delta=1e-5, sample_rate=rate, steps=steps)
    sigma, eps = calibrate_noise(
        mechanism, target_epsilon=target, delta=1e-5, sample_rate=rate, steps=steps
    )
    assert target - 0.01 <= eps <= target
    assert eps == epsilon(mechanism, [(sigma, rate, steps)], 1e-5, reference=True)


def test_interval_checks_reuse_the_step_limit_certificate() -> None:
    """certify(T ≤ horizon) is the horizon's cached bound, which bounds ε(T) (monotone in T)."""
    from fedldp.aggregator.training.accounting import BudgetAccountant

    acct = BudgetAccountant("prv", 1e-5, Decimal(3), 0.1, 1.5)
    acct.horizon = acct.step_limit(40)
    queries = acct.queries
    for t in (10, 20, acct.horizon):
        assert acct.certify(t) == acct.epsilon_at(acct.horizon)
        assert acct.certify(t) >= epsilon("prv", [(1.5, 0.1, t)], 1e-5, reference=True)
    assert acct.queries == queries  # no accountant work for the checks
    beyond = acct.certify(acct.horizon + 1)  # beyond the certificate: computed
    assert acct.queries == queries + 1
    assert beyond == epsilon("prv", [(1.5, 0.1, acct.horizon + 1)], 1e-5)


def test_receipt_and_ledger_hold_only_keyed_data_digests(
    make_config: ConfigFactory,
    ledger: Ledger,
    check_receipt: Callable[..., Any],
    table: Path,
) -> None:
    """Finding 02 for training: neither the receipt nor the ledger's event may carry a plain
    digest of the protected table (a dictionary attack on the last unknown row); the keyed
    binding verifies only with the data-digest key."""
    import hashlib
    import json

    result = train_private(make_config(budget={"idempotency_key": "keyed"}), ledger=ledger)
    loaded = load_dataset(make_config().data)
    plain = {
        hashlib.sha256(table.read_bytes()).hexdigest(),
        loaded.digest,
    }
    published = result.receipt_path.read_text() + json.dumps(
        [dict(e.event) for e in ledger.central_events(SUBJECT, PURPOSE)]
    )
    assert not any(p in published for p in plain)
    assert check_receipt(result.receipt_path).ok
    skipped = check_receipt(result.receipt_path, data_key=None)
    (dataset,) = [c for c in skipped.checks if c.name == "dataset"]
    assert dataset.skipped and "data binding not checked" in dataset.detail


def _neighbour_tables(tmp_path: Path) -> tuple[Path, Path]:
    """D' (200 rows of classes 0 and 1) and D = D' plus Alice, the only row of class 2."""
    from .conftest import write_table

    without = tmp_path / "without.csv"
    write_table(without)
    with_alice = tmp_path / "with.csv"
    with_alice.write_text(without.read_text() + "0.5,0.5,0.5,0.5,2\n")
    return with_alice, without


def test_neighbouring_tables_publish_the_same_schema_and_spend(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    """Finding 03: the model's shape, the published row count, q and the charge came from the
    data (max label + 1, n). With the schema declared they are identical on neighbours."""
    with_alice, without = _neighbour_tables(tmp_path)
    published = []
    for name, path in (("with", with_alice), ("without", without)):
        cfg = make_config(
            data={"path": str(path), "num_classes": 3},
            budget={"idempotency_key": f"nb-{name}"},
            output={"dir": str(tmp_path / f"out-{name}")},
        )
        result = train_private(cfg, ledger=ledger)
        receipt = result.receipt
        shapes = [tuple(v.shape) for v in result.model.state_dict().values()]
        training = {k: v for k, v in receipt["training"].items() if "seconds" not in k}
        privacy = {k: v for k, v in receipt["privacy"].items()}
        published.append((shapes, receipt["model"]["num_classes"], training, privacy))
        assert "rows" not in receipt["dataset"] and "rows" not in receipt["training"]
        assert receipt["dataset"]["declared_rows"] == 200
        assert "batch_size_min" not in receipt["training"]
    assert published[0] == published[1]
    spends = [r.epsilon_spent for r in ledger.reservations(SUBJECT, PURPOSE)]
    assert len(spends) == 2 and spends[0] == spends[1]


def test_a_label_outside_num_classes_fails_charged(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    with_alice, _ = _neighbour_tables(tmp_path)
    cfg = make_config(data={"path": str(with_alice)}, budget={"idempotency_key": "outside"})
    outside = r"a label lies outside 0\.\.1 \(\[data\] num_classes = 2\)"
    with pytest.raises(TrainingAbortedError, match=outside) as info:
        train_private(cfg, ledger=ledger)
    assert isinstance(info.value.__cause__, DataError)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon_spent == Decimal(1)
    assert _outputs(cfg) == []


@pytest.mark.parametrize("missing", ["features", "num_classes", "rows"])
def test_the_schema_must_be_declared(make_config: ConfigFactory, missing: str) -> None:
    from fedldp.aggregator.training.config import TrainingConfigError

    with pytest.raises(TrainingConfigError, match=rf"\[data\] {missing} is required"):
        make_config(data={missing: None})
