"""A zoo factory whose module keeps a data-dependent buffer (auditor atk2): an
operator's innocent-looking module (a running statistic, a cache) that the
training step updates without clipping or noise."""

from __future__ import annotations

import torch
from torch import nn


class _Memo(nn.Module):
    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(num_features, num_classes)
        self.register_buffer("seen", torch.zeros(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > 0:
            with torch.no_grad():  # a raw training row, kept as it is
                self.seen.copy_(x[0].detach().to(self.seen.dtype))
        return self.linear(x)


def memorizer(num_features: int, num_classes: int) -> nn.Module:
    return _Memo(num_features, num_classes)
