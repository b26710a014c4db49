"""A model factory an operator might allow in the zoo (`module = "...:tiny_linear"`)."""

from __future__ import annotations

from torch import nn


def tiny_linear(num_features: int, num_classes: int) -> nn.Module:
    """A linear classifier: num_features inputs, num_classes logits."""
    return nn.Sequential(nn.Linear(num_features, num_classes))
