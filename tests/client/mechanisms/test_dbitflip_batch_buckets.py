"""dBitFlipPM's batch bucketing (simulations, audits) equals the device's exact
`bucket` value by value, repeats, clipping and signed zeros included."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
from fedldp.client.mechanisms.dbitflip import DBitFlip


def test_batch_buckets_are_the_exact_buckets() -> None:
    mech = DBitFlip(
        Decimal(1), Decimal("-1"), Decimal("2.5"), buckets=16, epsilon_permanent=Decimal(2), d=4
    )
    rng = np.random.default_rng(5)
    edges = [-1 + 3.5 * i / 16 for i in range(17)]  # every bucket boundary, exactly
    values = np.concatenate(
        [rng.uniform(-3, 4, 2_001), np.repeat([0.0, -0.0, 2.5, -1.0], 50), edges]
    ).reshape(-1, 2)
    got = mech._buckets_batch(values)
    assert got.shape == values.shape
    assert got.ravel().tolist() == [mech.bucket(float(v)) for v in values.ravel()]
