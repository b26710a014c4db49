"""The errors of a private training run, by how far the run got.

Before reserving: OutputExistsError (and config.TrainingConfigError,
models.UnsupportedModelError). At the reservation: BudgetRefusedError,
ReservationTakenError (nothing read). After reserving: TrainingAbortedError
(nothing written; cancelled or settled as spent by the refund rule, engine.py).
"""

from __future__ import annotations


class BudgetRefusedError(RuntimeError):
    """The ledger refused the reservation: nothing was read, trained or written."""


class TrainingAbortedError(RuntimeError):
    """The run failed after reserving; no artifact was written. The reservation was
    cancelled if no data had been read, else settled as spent."""


class ReservationTakenError(BudgetRefusedError):
    """The idempotency key's reservation belongs to another run (open or closed): this run
    reads nothing and trains nothing."""


class PoissonSamplingError(ValueError):
    """A loader does not do the Poisson sampling the accountant assumes."""


class OutputExistsError(FileExistsError):
    """The output folder already holds a model or receipt; a release is never overwritten."""


class DistributedError(RuntimeError):
    """A multi-process run cannot start (a process group already exists in this process,
    or `nproc` is not a positive integer); raised before anything is reserved."""
