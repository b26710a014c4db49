"""Randomness for Poisson sampling and DP noise.

Opacus's `secure_mode` draws both from torchcsprng, which does not install with
current torch (ImportError). What this module does instead, and what it buys:

- Two `torch.Generator`s, one for the Poisson sampler, one for the Gaussian
  noise, each **reseeded with 64 fresh bits from the OS CSPRNG**
  (`secrets.randbits`, i.e. getrandom(2)/ChaCha20 on Linux) before every
  training step. A generator's state therefore never spans two steps, and
  the seed of a step is not derivable from any other step's seed or output.
- The optimizer runs with Opacus's `secure_mode` *noise formula* enabled
  (each noise value is the sum of four Gaussians divided by two, after a
  discarded draw; Holohan & Braghin 2021, "Secure Random Sampling in
  Differential Privacy", §5.1), which defeats the floating-point attacks on
  naive Gaussian sampling (Mironov 2012; Jin et al. 2022).

What it protects against: an adversary who sees the released model (or even
every intermediate model) cannot predict or replay the noise, since each
step's noise comes from a fresh OS-entropy seed; recovering one step's
Mersenne-Twister/Philox state does not help with another step.

What it does not protect against: within one step the noise stream is
torch's CPU generator (MT19937), not a CSPRNG, and its seed has 64 bits, so
an adversary with enough compute and a step's exact pre-noise gradient sum
could search 2^64 seeds for that step; an attacker who can read the training
process's memory sees everything anyway; and timing side channels of the
sampler are not addressed. A fixed seed (`source = "seeded"`) removes all of
this protection and exists for tests only; its receipts say so.
"""

from __future__ import annotations

import secrets

import torch

SEED_BITS = 64


class StepRandomness:
    """The sampling and noise generators of one run, reseeded before each step.

    With `seed=None` (production) every `reseed()` draws fresh OS entropy.
    With an integer seed the generators are seeded once and `reseed()` does
    nothing, making a run reproducible: tests only.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.sampling = torch.Generator()
        self.noise = torch.Generator()
        self.seeded = seed is not None
        if seed is not None:
            self.sampling.manual_seed(seed)
            self.noise.manual_seed(seed ^ 0x5DEECE66D)
        else:
            self.reseed()

    def reseed(self) -> None:
        """Give both generators fresh 64-bit seeds from the OS CSPRNG (no-op when seeded)."""
        if self.seeded:
            return
        self.sampling.manual_seed(secrets.randbits(SEED_BITS))
        self.noise.manual_seed(secrets.randbits(SEED_BITS))

    def describe(self) -> dict[str, object]:
        """The receipt's description of the randomness (never a seed)."""
        if self.seeded:
            return {
                "source": "seeded",
                "warning": "fixed seed: reproducible, NOT private against anyone who knows it "
                "(tests only)",
            }
        return {
            "source": "os-entropy",
            "reseed": f"sampling and noise torch.Generator reseeded from secrets.randbits("
            f"{SEED_BITS}) before every step",
            "noise_formula": "opacus secure_mode (sum of 4 Gaussians / 2; Holohan & Braghin 2021)",
        }
