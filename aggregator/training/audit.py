"""Membership-inference audit: how well can an attacker tell training rows from others?

Two attacks, both needing only the model's outputs on a row and its label:

- **loss threshold** (Yeom, Giacomelli, Fredrikson, Jha 2018, "Privacy Risk in
  Machine Learning", §3.2): score = −loss; members tend to have lower loss.
- **shadow-free likelihood ratio** (the "offline" LiRA of Carlini et al. 2022,
  "Membership Inference Attacks From First Principles", §IV-C and §VI-B, with
  the non-member distribution estimated per class from a held-out reference
  split instead of shadow models): φ = log(p_y / (1 − p_y)) (their logit
  scaling, §IV-B); under "non-member" φ ~ N(μ_y, σ_y²) fitted on the reference
  split; score = (φ − μ_y)/σ_y, the one-sided test statistic. This removes the
  per-class difficulty that confounds the plain loss threshold.

The held-out rows are split in two: a reference half (used only to fit μ, σ) and
an evaluation half; members are subsampled to the evaluation half's size so both
classes weigh the same. Reported: ROC AUC with a 95 % percentile-bootstrap
interval (BOOTSTRAP resamples of members and non-members, fixed seed; Efron and
Tibshirani 1993, §13.3), and TPR at each requested FPR with a 95 %
Clopper–Pearson interval (exact binomial; Clopper and Pearson 1934). An FPR is
reported only when the evaluated non-members allow at least MIN_FALSE_POSITIVES
false positives at it (n · FPR ≥ 10); a lower FPR is listed as unresolved with
the number of held-out rows it would need, rather than given a point estimate
that the sample cannot support.

For an (ε, δ)-DP training run, any attack's ROC lies under
TPR ≤ min(1, e^ε·FPR + δ, 1 − e^(−ε)·(1 − δ − FPR)) (Kairouz, Oh, Viswanath
2015, "The Composition Theorem for Differential Privacy", Thm. 2.1; the
hypothesis-testing region of (ε, δ)-DP), and its AUC under the area of that
curve. A TPR whose Clopper–Pearson LOWER bound is above the DP bound at its
achieved FPR refutes the claimed (ε, δ) at 95 % confidence (`violations`).

Audit outputs are computed from the private training rows and are not
themselves differentially private: they are for the operator's review.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# clopper_pearson stays part of this module's interface (its home: intervals.py).
from fedldp.aggregator.intervals import clopper_pearson as clopper_pearson
from numpy.typing import NDArray
from torch import nn

DEFAULT_FPRS = (0.001, 0.01, 0.1)
#: An FPR is resolvable when the evaluated non-members allow this many false positives.
MIN_FALSE_POSITIVES = 10
#: Bootstrap resamples of the AUC interval, and the intervals' confidence level.
BOOTSTRAP = 1000
LEVEL = 0.95


def auc_interval(
    members: NDArray[np.float64],
    nonmembers: NDArray[np.float64],
    *,
    seed: int,
    resamples: int = BOOTSTRAP,
    level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the AUC: members and non-members resampled
    independently with replacement (fixed seed: reproducible)."""
    rng = np.random.default_rng(seed)
    n, m = len(members), len(nonmembers)
    stats = [
        roc_auc(members[rng.integers(0, n, n)], nonmembers[rng.integers(0, m, m)])
        for _ in range(resamples)
    ]
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def dp_tpr_bound(epsilon: float, delta: float, fpr: float) -> float:
    """The largest TPR any attack can reach at `fpr` against an (ε, δ)-DP mechanism."""
    if math.isinf(epsilon):
        return 1.0
    e = math.exp(epsilon)
    return max(0.0, min(1.0, e * fpr + delta, 1.0 - (1.0 - delta - fpr) / e))


def dp_auc_bound(epsilon: float, delta: float, grid: int = 100_001) -> float:
    """The area under dp_tpr_bound over FPR ∈ [0, 1] (trapezoid rule on `grid` points)."""
    if math.isinf(epsilon):
        return 1.0
    x = np.linspace(0.0, 1.0, grid)
    e = math.exp(epsilon)
    y = np.clip(np.minimum(np.minimum(e * x + delta, 1.0 - (1.0 - delta - x) / e), 1.0), 0, 1)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


def _logits(model: nn.Module, features: NDArray[Any]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out: torch.Tensor = model(torch.as_tensor(features, dtype=torch.float32))
    return out.double()


def per_sample_loss(
    model: nn.Module, features: NDArray[Any], labels: NDArray[Any]
) -> NDArray[np.float64]:
    """Cross-entropy loss of each row."""
    logits = _logits(model, features)
    y = torch.as_tensor(labels, dtype=torch.long)
    loss = nn.functional.cross_entropy(logits, y, reduction="none")
    return np.asarray(loss.numpy(), dtype=np.float64)


def logit_confidence(
    model: nn.Module, features: NDArray[Any], labels: NDArray[Any]
) -> NDArray[np.float64]:
    """φ = log p_y − log(1 − p_y), computed stably as z_y − logsumexp(z_{≠y})."""
    z = _logits(model, features)
    y = torch.as_tensor(labels, dtype=torch.long)
    zy = z.gather(1, y[:, None]).squeeze(1)
    others = z.clone()
    others.scatter_(1, y[:, None], -math.inf)
    return np.asarray((zy - torch.logsumexp(others, dim=1)).numpy(), dtype=np.float64)


def roc_auc(members: NDArray[np.float64], nonmembers: NDArray[np.float64]) -> float:
    """P(score_member > score_nonmember) + ½·P(tie) (Mann–Whitney U / (n·m))."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([members, nonmembers]))  # ties get their average rank
    n, m = len(members), len(nonmembers)
    u = float(ranks[:n].sum()) - n * (n + 1) / 2
    return u / (n * m)


def tpr_at_fpr(
    members: NDArray[np.float64], nonmembers: NDArray[np.float64], fpr: float
) -> tuple[float, float]:
    """(TPR, achieved FPR) of the threshold rule "score > t" with the most lenient t
    whose FPR on `nonmembers` is at most `fpr`."""
    neg = np.sort(nonmembers)[::-1]
    allowed = math.floor(fpr * len(neg))
    threshold = neg[allowed] if allowed < len(neg) else -math.inf
    achieved = float(np.mean(nonmembers > threshold))
    return float(np.mean(members > threshold)), achieved


@dataclass(frozen=True)
class AttackResult:
    """One attack's figures on one model, with 95 % intervals (module docstring).

    `tpr_at_fpr`, `achieved_fpr` and `tpr_interval` hold the resolvable FPRs only;
    `unresolved` maps each other requested FPR to the non-members it would need.
    """

    attack: str
    auc: float
    tpr_at_fpr: dict[float, float]
    achieved_fpr: dict[float, float]
    auc_interval: tuple[float, float] = (0.0, 1.0)
    tpr_interval: dict[float, tuple[float, float]] = field(default_factory=dict)
    unresolved: dict[float, int] = field(default_factory=dict)


@dataclass
class AuditReport:
    """The audit of one model: attacks, sample sizes, and the DP bound if any."""

    model: str
    epsilon: float
    delta: float
    n_members: int
    n_nonmembers: int
    attacks: list[AttackResult] = field(default_factory=list)

    def bound(self, fpr: float) -> float:
        """The largest TPR an (ε, δ)-DP model allows at false-positive rate `fpr`."""
        return dp_tpr_bound(self.epsilon, self.delta, fpr)

    def violations(self) -> list[str]:
        """(attack, FPR) points whose TPR lower bound exceeds the DP bound at the achieved
        FPR, and AUC lower bounds above the DP AUC bound: evidence against (ε, δ)."""
        out = []
        for a in self.attacks:
            for f, (lo, _) in a.tpr_interval.items():
                if lo > self.bound(a.achieved_fpr[f]):
                    out.append(f"{a.attack} TPR@{f:g}")
            if a.auc_interval[0] > dp_auc_bound(self.epsilon, self.delta):
                out.append(f"{a.attack} AUC")
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict of the audit (ε None when the model is not private)."""
        return {
            "model": self.model,
            "epsilon": None if math.isinf(self.epsilon) else self.epsilon,
            "delta": self.delta,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            "fpr_resolution": 1 / self.n_nonmembers,
            "auc_bound": dp_auc_bound(self.epsilon, self.delta),
            "confidence_level": LEVEL,
            "violations": self.violations(),
            "attacks": [
                {
                    "attack": a.attack,
                    "auc": a.auc,
                    "auc_interval": list(a.auc_interval),
                    "tpr_at_fpr": {
                        str(f): {
                            "tpr": t,
                            "tpr_interval": list(a.tpr_interval[f]),
                            "achieved_fpr": a.achieved_fpr[f],
                            "dp_bound": self.bound(a.achieved_fpr[f]),
                        }
                        for f, t in a.tpr_at_fpr.items()
                    },
                    "unresolved_fpr": {
                        str(f): {"needs_nonmembers": n} for f, n in a.unresolved.items()
                    },
                }
                for a in self.attacks
            ],
        }


def membership_audit(
    model: nn.Module,
    members: tuple[NDArray[Any], NDArray[Any]],
    nonmembers: tuple[NDArray[Any], NDArray[Any]],
    *,
    name: str,
    epsilon: float = math.inf,
    delta: float = 0.0,
    fprs: Sequence[float] = DEFAULT_FPRS,
    seed: int = 0,
) -> AuditReport:
    """Run both attacks on `model` (module docstring) and return the figures.

    `members` are (features, labels) of training rows, `nonmembers` rows of the
    same population never trained on (at least 4). `seed` fixes the split and
    subsampling, so an audit is reproducible; it has nothing to do with privacy.
    """
    xm, ym = members
    xn, yn = nonmembers
    if len(yn) < 4 or len(ym) < 2:
        raise ValueError("the audit needs at least 2 members and 4 held-out rows")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(yn))
    ref, ev = perm[: len(yn) // 2], perm[len(yn) // 2 :]
    take = min(len(ev), len(ym))
    ev = ev[:take]
    mem = rng.permutation(len(ym))[:take]

    loss_m = -per_sample_loss(model, xm[mem], ym[mem])
    loss_n = -per_sample_loss(model, xn[ev], yn[ev])

    phi_ref = logit_confidence(model, xn[ref], yn[ref])
    phi_m = logit_confidence(model, xm[mem], ym[mem])
    phi_n = logit_confidence(model, xn[ev], yn[ev])
    mu_all, sd_all = float(phi_ref.mean()), float(phi_ref.std() or 1.0)

    def standardize(phi: NDArray[np.float64], labels: NDArray[Any]) -> NDArray[np.float64]:
        out = np.empty_like(phi)
        for i, (v, c) in enumerate(zip(phi, labels, strict=True)):
            ref_c = phi_ref[yn[ref] == c]
            if len(ref_c) >= 2 and ref_c.std() > 0:
                out[i] = (v - ref_c.mean()) / ref_c.std()
            else:  # too few reference rows of this class: pooled estimate
                out[i] = (v - mu_all) / sd_all
        return out

    lr_m = standardize(phi_m, ym[mem])
    lr_n = standardize(phi_n, yn[ev])

    report = AuditReport(name, epsilon, delta, take, take)
    for attack, sm, sn in (("loss-threshold", loss_m, loss_n), ("offline-lira", lr_m, lr_n)):
        report.attacks.append(_attack_result(attack, sm, sn, fprs, seed))
    return report


def _attack_result(
    attack: str,
    members: NDArray[np.float64],
    nonmembers: NDArray[np.float64],
    fprs: Sequence[float],
    seed: int,
) -> AttackResult:
    """AUC and TPR at each resolvable FPR, with their 95 % intervals."""
    tprs, achieved, intervals, unresolved = {}, {}, {}, {}
    for f in fprs:
        if len(nonmembers) * f < MIN_FALSE_POSITIVES:
            unresolved[f] = math.ceil(MIN_FALSE_POSITIVES / f)
            continue
        tprs[f], achieved[f] = tpr_at_fpr(members, nonmembers, f)
        intervals[f] = clopper_pearson(round(tprs[f] * len(members)), len(members), LEVEL)
    return AttackResult(
        attack,
        roc_auc(members, nonmembers),
        tprs,
        achieved,
        auc_interval(members, nonmembers, seed=seed),
        intervals,
        unresolved,
    )


def format_report(report: AuditReport) -> str:
    """A plain-text table of one audit."""
    eps = "inf (no privacy)" if math.isinf(report.epsilon) else f"{report.epsilon:g}"
    lines = [
        f"model: {report.model}   eps={eps} delta={report.delta:g}   "
        f"members={report.n_members} non-members={report.n_nonmembers} "
        f"(FPR resolution {1 / report.n_nonmembers:.2g})",
        f"  DP bound on AUC: {dp_auc_bound(report.epsilon, report.delta):.4f}",
    ]
    for a in report.attacks:
        parts = [
            f"TPR@{f:g}={t:.3f} [{a.tpr_interval[f][0]:.3f}, {a.tpr_interval[f][1]:.3f}] "
            f"(bound {report.bound(a.achieved_fpr[f]):.3f})"
            for f, t in a.tpr_at_fpr.items()
        ]
        parts += [f"TPR@{f:g} unresolved (needs {n} non-members)" for f, n in a.unresolved.items()]
        lo, hi = a.auc_interval
        lines.append(f"  {a.attack:<15} AUC={a.auc:.3f} [{lo:.3f}, {hi:.3f}]  " + "  ".join(parts))
    found = report.violations()
    lines.append(
        "  95% intervals; no point refutes the (eps, delta) bound"
        if not found
        else f"  BOUND REFUTED at 95% by: {', '.join(found)}"
    )
    return "\n".join(lines)
