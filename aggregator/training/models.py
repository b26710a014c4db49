"""Models: the built-in tabular MLP, Opacus's module validation, grad-sample mode choice."""

from __future__ import annotations

from dataclasses import dataclass

from fedldp.aggregator.training.config import ModelConfig
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.validators import ModuleValidator
from opacus.validators.errors import UnsupportedModuleError
from torch import nn


class UnsupportedModelError(ValueError):
    """The model has layers DP-SGD cannot train with per-sample clipping (e.g. BatchNorm)."""


def build_mlp(config: ModelConfig, num_features: int, num_classes: int) -> nn.Sequential:
    """An MLP num_features → hidden... → num_classes with the configured activation and norm.

    `norm = "batch"` builds BatchNorm1d layers, which mix samples of a batch and
    are therefore rejected by validation unless fixed (GroupNorm) on request.
    """
    layers: list[nn.Module] = []
    width = num_features
    for hidden in config.hidden:
        layers.append(nn.Linear(width, hidden))
        if config.norm == "batch":
            layers.append(nn.BatchNorm1d(hidden))
        elif config.norm == "group":
            layers.append(nn.GroupNorm(_groups(hidden), hidden))
        elif config.norm == "layer":
            layers.append(nn.LayerNorm(hidden))
        layers.append(nn.ReLU() if config.activation == "relu" else nn.Tanh())
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _groups(channels: int) -> int:
    for g in (8, 4, 2):
        if channels % g == 0:
            return g
    return 1


@dataclass(frozen=True)
class ValidatedModel:
    """A module Opacus accepts, and what (if anything) was replaced to get it."""

    module: nn.Module
    fixed: tuple[str, ...]


def validate_model(module: nn.Module, *, fix: bool) -> ValidatedModel:
    """Check `module` for DP-SGD: Opacus's ModuleValidator, then `require_parameters_only`.

    Without `fix`, an unsupported layer raises UnsupportedModelError naming it.
    With `fix`, ModuleValidator.fix replaces them (BatchNorm -> GroupNorm) and the
    replaced layers are listed in `fixed` so the caller can say so. Either way the
    module that comes out must keep no state besides its trainable parameters
    (UnsupportedModelError naming the entries otherwise).
    """
    checked = _opacus_validate(module, fix=fix)
    require_parameters_only(checked.module)
    return checked


def _opacus_validate(module: nn.Module, *, fix: bool) -> ValidatedModel:
    """Opacus's ModuleValidator (layer types only, e.g. BatchNorm); fix only if `fix`."""
    errors = ModuleValidator.validate(module, strict=False)
    if not errors:
        return ValidatedModel(module, ())
    if not fix:
        detail = "; ".join(str(e) for e in errors)
        raise UnsupportedModelError(
            f"the model has layers DP-SGD cannot train: {detail}. "
            "Pass --fix-model (or fix_model = true) to replace them (BatchNorm -> GroupNorm)"
        )
    before = {name: type(m).__name__ for name, m in module.named_modules()}
    fixed_module = ModuleValidator.fix(module)
    try:
        ModuleValidator.validate(fixed_module, strict=True)
    except UnsupportedModuleError as exc:
        raise UnsupportedModelError(f"the model cannot be fixed for DP-SGD: {exc}") from exc
    after = {name: type(m).__name__ for name, m in fixed_module.named_modules()}
    changes = tuple(
        f"{name}: {before[name]} -> {after[name]}"
        for name in before
        if name in after and before[name] != after[name]
    )
    return ValidatedModel(fixed_module, changes)


def non_parameter_state(module: nn.Module) -> list[str]:
    """The names of everything `module` keeps besides its trainable parameters, each with
    its kind: buffers (persistent or not), frozen parameters, and any other
    state_dict entry (extra state). Empty for a module DP-SGD fully covers."""
    trainable = {n for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
    found = {n: "buffer" for n, _ in module.named_buffers(remove_duplicate=False)}
    for n, p in module.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            found[n] = "frozen parameter"
    for key in module.state_dict(keep_vars=True):
        if key not in trainable:
            found.setdefault(key, "state_dict entry")
    return [f"{n} ({kind})" for n, kind in sorted(found.items())]


def require_parameters_only(module: nn.Module) -> None:
    """Refuse a module that keeps state besides its trainable parameters.

    DP-SGD (Abadi et al. 2016, §3.1) bounds only what reaches the parameters
    through clipped, noised gradients; a buffer, a frozen parameter or extra state
    that forward may write (BatchNorm's running statistics, a cache, a copy of an
    input) would be published with the model un-clipped and un-noised while the
    receipt claims (ε, δ). Raises UnsupportedModelError naming the entries.
    """
    extra = non_parameter_state(module)
    if extra:
        raise UnsupportedModelError(
            f"the model keeps state besides its trainable parameters: {', '.join(extra)}; "
            "DP-SGD bounds only the trainable parameters, so this state would be published "
            "without clipping or noise. Remove it or make it a trainable parameter (use "
            "GroupNorm or LayerNorm instead of BatchNorm; --fix-model replaces BatchNorm)"
        )


def trainable_layer_types(module: nn.Module) -> list[type[nn.Module]]:
    """The types of the modules that directly own a trainable parameter."""
    out: list[type[nn.Module]] = []
    for m in module.modules():
        if any(p.requires_grad for p in m.parameters(recurse=False)) and type(m) not in out:
            out.append(type(m))
    return out


def choose_grad_sample_mode(module: nn.Module) -> tuple[str, str]:
    """Pick the grad-sample mode for speed: ghost clipping when every trainable layer
    supports it, per-sample gradients through hooks otherwise. Returns (mode, reason).

    Ghost clipping (Li et al. 2022, "Large Language Models Can Be Strong
    Differentially Private Learners", §4; Bu et al. 2023) computes per-sample
    gradient norms without materializing per-sample gradients, at the price of a
    second backward pass; for a layer without a norm sampler Opacus would
    materialize them anyway and pay both costs, so ghost is chosen only when all
    trainable layers have one (bench/training.py measures the choice).
    """
    supported = GradSampleModuleFastGradientClipping.NORM_SAMPLERS
    types = trainable_layer_types(module)
    missing = sorted({t.__name__ for t in types if t not in supported})
    if not missing:
        names = ", ".join(sorted({t.__name__ for t in types}))
        return "ghost", f"ghost clipping: every trainable layer ({names}) has a norm sampler"
    return "hooks", f"hooks: ghost clipping has no norm sampler for {', '.join(missing)}"
