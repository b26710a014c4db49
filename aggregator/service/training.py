"""Training jobs: an analyst's DP-SGD request -> a queued job -> a signed receipt and a model.

No gRPC here (server.py wraps it). `TrainingJobs.submit` checks everything that
does not need the data, before anything is stored: the dataset is registered and
granted for the purpose (ReleaseEngine.authorize: the same message whether or not
it exists), the policy has a cap for (dataset, purpose), the dataset is declared
for training (`training_rows`), ε and δ, the key, the zoo model, the label and
feature columns (declared ones only) and the hyper-parameters (within the
catalog's `[training]` limits); a full queue is refused (QueueFullError). Only
then is the job stored (jobs.py) and queued.

A worker runs each job with the training engine's public API
(`fedldp.aggregator.training.train_private`), which follows issue 15's order:
reserve (ε, δ) in the ledger under the service's own subject
"<service id>/<dataset>" (the cap is the release policy's, shared with that
purpose's releases) -> record that the data is opened -> read -> train within the
budget -> sign the receipt with the service's key -> settle -> publish. The
refund rule is the engine's: a failure before the data is opened cancels, any
later outcome is charged (in full on failure). The job's record follows the
ledger through `_JobLedger`, which writes the owner token before the reservation
and marks the job charged once the data is opened, so a restarted service
(`recover`) closes what a killed one left open: cancelled when the data was never
opened, settled AS SPENT (the whole reservation) otherwise — never refunded; the
analyst's own-cap hold, if any, is closed the same way (`_close_hold`).

Training data: the catalog dataset's rows, read by the dataset's release engine
(DuckDB by default, Spark or the Python reference where the catalog says so) with
the releases' contribution bounding (aggregator/engines/plan.py) at ONE record per
unit, chosen uniformly at random per unit by a keyed hash under a fresh key
(DP-SGD's guarantee is per row, so per unit once each unit has one row), into
Arrow columns and then arrays without a Python row loop (`training_table`);
numeric features clipped to their declared bounds and scaled to [-1, 1];
categorical features one-hot over their declared domain; the label's class is its
position in the declared domain. Every transformation is fixed by the
declaration, never by the data. A value outside its declaration after
registration fails the job after the read (charged, fixed message).

Nothing a job reports (record, status, logs, metrics, errors) holds a data value:
errors after the read carry fixed messages, never an exception's text.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from fedldp.aggregator.service.catalog import (
    Catalog,
    CategoricalColumn,
    Dataset,
    NumericColumn,
    plain_decimal,
)
from fedldp.aggregator.service.engine import (
    InvalidRequestError,
    ReleaseEngine,
    ServiceError,
)
from fedldp.aggregator.service.holds import AnalystCapLedger
from fedldp.aggregator.service.jobs import (
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    JobRecord,
    JobStore,
    job_id_of,
    train_ledger_key,
)
from fedldp.aggregator.service.policy import ReleasePolicy, analyst_subject, ledger_subject
from fedldp.aggregator.service.zoo import TrainingCatalog, ZooModel
from fedldp.aggregator.training.config import (
    AccountantConfig,
    BudgetConfig,
    DataConfig,
    ModelConfig,
    ReceiptConfig,
    TrainConfig,
    TrainingConfigError,
    TrainingParams,
)
from fedldp.v1 import release_pb2 as pb

log = logging.getLogger("fedldp.release_service")

_KEY_RE = re.compile(r"[\x21-\x7e]{1,128}")
#: Longest GetTrainingJob wait, seconds.
MAX_WAIT_SECONDS = 30
#: FetchModel piece size.
CHUNK_BYTES = 1 << 20

_STATE = {
    QUEUED: pb.TRAINING_JOB_STATE_QUEUED,
    RUNNING: pb.TRAINING_JOB_STATE_RUNNING,
    SUCCEEDED: pb.TRAINING_JOB_STATE_SUCCEEDED,
    FAILED: pb.TRAINING_JOB_STATE_FAILED,
}
_OPTIMIZERS = {
    pb.TRAINING_OPTIMIZER_UNSPECIFIED: "sgd",
    pb.TRAINING_OPTIMIZER_SGD: "sgd",
    pb.TRAINING_OPTIMIZER_ADAM: "adam",
}
_ACCOUNTANTS = {
    pb.TRAINING_ACCOUNTANT_UNSPECIFIED: "prv",
    pb.TRAINING_ACCOUNTANT_PRV: "prv",
    pb.TRAINING_ACCOUNTANT_RDP: "rdp",
}
#: Fixed failure messages (never an exception's text: it could depend on the data).
SPENT_MESSAGE = (
    "the training failed after the data was opened; its budget is spent and nothing was released"
)
CANCELLED_MESSAGE = (
    "the training failed before the data was opened; its reservation was cancelled "
    "and nothing was charged"
)
STOPPED_MESSAGE = (
    "the release service stopped while this job was training; its budget is spent and "
    "nothing was released"
)
STOPPED_EARLY_MESSAGE = (
    "the release service stopped before this job opened the data; nothing was charged"
)


class TrainingDisabledError(ServiceError):
    """Training jobs are not enabled, or the dataset is not declared for training."""


class QueueFullError(ServiceError):
    """The training queue is full: nothing was stored or reserved."""


class JobConflictError(ServiceError):
    """The idempotency key names another job."""


class JobNotFoundError(ServiceError):
    """No such job for this analyst."""


class JobNotReadyError(ServiceError):
    """The job has no model (not SUCCEEDED)."""


@dataclass(frozen=True)
class TrainingSetup:
    """The operator's settings for training jobs (`serve --jobs-dir ...`)."""

    jobs_dir: Path
    #: The receipt key's PEM file (the engine signs with it) and its passphrase variable.
    signing_key_path: Path
    passphrase_env: str | None = None
    queue_size: int = 4
    workers: int = 1


@dataclass(frozen=True)
class _Plan:
    """A validated job: its engine configuration and the zoo model."""

    config: TrainConfig
    dataset: Dataset
    zoo: ZooModel
    label: str
    columns: tuple[str, ...]
    feature_names: tuple[str, ...]


class TrainingJobs:
    """Accepts, queues, runs, reports and recovers the service's DP-SGD jobs."""

    def __init__(
        self,
        setup: TrainingSetup,
        engine: ReleaseEngine,
        catalog: Catalog,
        policy: ReleasePolicy,
        ledger: Any,
        service_id: str,
        clock: Callable[[], int],
        metrics: Any,
    ) -> None:
        """`engine` authorizes (the releases' rule); `metrics` has `jobs` (Counter by
        state), `queue` (Gauge) and `seconds` (Histogram)."""
        self.setup, self.engine, self.catalog, self.policy = setup, engine, catalog, policy
        self.ledger, self.service_id, self.clock, self.metrics = ledger, service_id, clock, metrics
        self.store = JobStore(setup.jobs_dir)
        self._queue: deque[str] = deque()
        self._lock = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # --- lifecycle ---

    def start(self) -> None:
        """Recover what a previous process left (`recover`), then start the workers."""
        import warnings

        warnings.filterwarnings("ignore", module="opacus")  # as `fedldp train` does
        self.recover()
        for n in range(self.setup.workers):
            thread = threading.Thread(target=self._work, name=f"training-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, grace: float) -> None:
        """Start no new job; wait up to `grace` s for running ones; release the folder.

        A job still training when the process exits is closed by the next start
        (`recover`): settled as spent, reported FAILED.
        """
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        deadline = time.monotonic() + max(grace, 1.0)  # idle workers return at once
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(t.is_alive() for t in self._threads):
            self.store.close()

    def recover(self) -> None:
        """Queue the QUEUED jobs again; close every RUNNING job a stopped process left.

        A RUNNING record means the process stopped during the job. Its reservation
        (by id, or by ledger key and owner when the crash came before the id was
        recorded) is: cancelled if the data was never opened (nothing read);
        settled as spent in full if it was (the refund rule: never refunded); kept
        as it is if already closed. The analyst's own-cap hold follows it
        (`_close_hold`). The job is SUCCEEDED only if the engine had settled and
        published both files, FAILED otherwise.
        """
        for record in self.store.records():
            if record.state == QUEUED:
                self._queue.append(record.job_id)
            elif record.state == RUNNING:
                self._recover_running(record)
        self.metrics.queue.set(len(self._queue))

    def _recover_running(self, record: JobRecord) -> None:
        from fedldp.collector.ledger import ReservationNotFoundError

        res = None
        if record.reservation_id:
            try:
                res = self.ledger.reservation(record.reservation_id)
            except ReservationNotFoundError:
                res = None
        elif record.owner:
            subject = ledger_subject(self.service_id, record.dataset)
            for candidate in self.ledger.reservations(subject, record.purpose):
                if candidate.idempotency_key == record.ledger_key and candidate.held_by(
                    record.owner
                ):
                    res = candidate
        if res is None:
            self._fail(record.job_id, "UNAVAILABLE", STOPPED_EARLY_MESSAGE, "ServiceStopped")
            return
        now = self.clock()
        if res.status == "reserved" and res.data_opened_at is None:
            self.ledger.cancel(res.id, now=now, owner=record.owner)
            self._close_hold(record, self.ledger.reservation(res.id), now)
            self._fail(
                record.job_id, "UNAVAILABLE", STOPPED_EARLY_MESSAGE, "ServiceStopped", res.id
            )
            return
        if res.status == "reserved":
            self.ledger.settle(
                res.id,
                epsilon_spent=res.epsilon,
                delta_spent=res.delta,
                events=(),
                now=now,
                owner=record.owner,
                reason=f"the release service stopped during training job {record.job_id}; "
                "nothing released",
            )
            self._close_hold(record, self.ledger.reservation(res.id), now)
            self._fail(
                record.job_id, "UNAVAILABLE", STOPPED_MESSAGE, "ServiceStopped", res.id, True
            )
            return
        self._close_hold(record, res, now)
        out = self.store.output(record.job_id)
        published = (out / "model.pt").is_file() and (out / "receipt.json").is_file()
        if res.status == "settled" and published:
            self._succeed_from_files(record.job_id, res)
            return
        charged = res.status == "settled"
        message = STOPPED_MESSAGE if charged else STOPPED_EARLY_MESSAGE
        self._fail(record.job_id, "UNAVAILABLE", message, "ServiceStopped", res.id, charged)

    def _close_hold(self, record: JobRecord, res: Any, now: int) -> None:
        """Close the analyst's own-cap hold (holds.py) of a job's closed reservation `res`.

        The hold follows the reservation: settled with the same spend when it is
        settled (in full after a crash: never refunded once the data was opened);
        cancelled when it was cancelled, unless the hold itself was already opened
        (then settled as spent in full, as `AnalystCapLedger.cancel` does). A hold
        already closed (an earlier, interrupted recovery) is left as it is.
        """
        if (record.dataset, record.purpose, record.analyst) not in self.policy.analyst_caps:
            return
        subject = analyst_subject(self.service_id, record.dataset, record.analyst)
        key = f"analyst-cap:{res.id}"
        for hold in self.ledger.reservations(subject, record.purpose):
            if hold.idempotency_key != key or hold.status != "reserved":
                continue
            reason = f"analyst cap of reservation {res.id}: the release service stopped"
            if res.status == "settled":
                spent = (res.epsilon_spent, res.delta_spent)
            elif hold.data_opened_at is None:
                self.ledger.cancel(hold.id, now=now, owner=record.owner)
                continue
            else:
                spent = (hold.epsilon, hold.delta)
            self.ledger.settle(
                hold.id,
                epsilon_spent=spent[0],
                delta_spent=spent[1],
                events=(),
                now=now,
                owner=record.owner,
                reason=reason,
            )

    def _succeed_from_files(self, job_id: str, res: Any) -> None:
        """A job the engine settled and published before the process stopped."""
        from fedldp.aggregator.training.receipt import load_receipt

        out = self.store.output(job_id)
        receipt = load_receipt(out / "receipt.json")
        model = (out / "model.pt").read_bytes()
        self.store.update(
            job_id,
            state=SUCCEEDED,
            finished_at=self.clock(),
            reservation_id=res.id,
            charged=True,
            epsilon_spent=str(res.epsilon_spent),
            delta_spent=str(res.delta_spent),
            steps=int(receipt["training"]["steps"]),
            stop_reason=str(receipt["training"]["stop_reason"]),
            model_sha256=hashlib.sha256(model).hexdigest(),
            model_size=len(model),
        )
        self.metrics.jobs.labels(SUCCEEDED).inc()

    # --- the analyst's calls ---

    def submit(self, analyst: str, request: pb.SubmitTrainingRequest) -> pb.TrainingJob:
        """Validate, store and queue a job (module docstring); the job's state."""
        ledger_key = train_ledger_key(analyst, request.idempotency_key)
        job_id = job_id_of(ledger_key)
        self._plan(analyst, request, ledger_key, self.store.output(job_id))
        if not _KEY_RE.fullmatch(request.idempotency_key):
            raise InvalidRequestError("idempotency_key must be 1-128 printable ASCII characters")
        raw = request.SerializeToString(deterministic=True)
        with self._lock:
            existing = self.store.get(job_id)
            if existing is not None:
                if existing.request_sha256 != hashlib.sha256(raw).hexdigest():
                    raise JobConflictError(
                        "this idempotency key was used for another training job; use a new key"
                    )
                if not _retryable(existing):
                    return self._message(existing)
            self._check_room()
            record = JobRecord(
                job_id=job_id,
                analyst=analyst,
                ledger_key=ledger_key,
                request_b64=base64.b64encode(raw).decode("ascii"),
                request_sha256=hashlib.sha256(raw).hexdigest(),
                state=QUEUED,
                submitted_at=self.clock(),
                dataset=request.dataset,
                purpose=request.purpose,
                model=request.model,
            )
            if existing is None:
                self.store.create(record)
            else:
                self.store.save(record)
            self._queue.append(job_id)
            self.metrics.queue.set(len(self._queue))
            self.metrics.jobs.labels(QUEUED).inc()
            self._lock.notify_all()
        log.info("training job queued", extra={"fields": {"job_id": job_id}})
        return self._message(record)

    def _check_room(self) -> None:
        if len(self._queue) >= self.setup.queue_size:
            raise QueueFullError(
                f"the training queue is full ({self.setup.queue_size} jobs waiting); nothing was "
                "stored or reserved: submit again later"
            )

    def job(self, analyst: str, request: pb.GetTrainingJobRequest) -> pb.TrainingJob:
        """The state of one of the analyst's jobs, after waiting up to `wait_seconds`."""
        if request.wait_seconds > MAX_WAIT_SECONDS:
            raise InvalidRequestError(f"wait_seconds must be at most {MAX_WAIT_SECONDS}")
        record = self._own(analyst, request.job_id)
        if request.wait_seconds:
            self.store.wait_finished(record.job_id, request.wait_seconds)
        return self._message(self._own(analyst, request.job_id))

    def model_chunks(self, analyst: str, request: pb.FetchModelRequest) -> Iterator[pb.ModelChunk]:
        """The model artefact of a SUCCEEDED job, in CHUNK_BYTES pieces."""
        record = self._own(analyst, request.job_id)
        if record.state != SUCCEEDED:
            raise JobNotReadyError("the job has no model: it has not succeeded")
        path = self.store.output(record.job_id) / "model.pt"
        with path.open("rb") as fh:
            data = fh.read()  # whole, so the bytes sent are the bytes digested
        if hashlib.sha256(data).hexdigest() != record.model_sha256:
            raise JobNotReadyError("the stored model does not match its digest; ask the operator")
        return (
            pb.ModelChunk(offset=offset, data=data[offset : offset + CHUNK_BYTES])
            for offset in range(0, max(len(data), 1), CHUNK_BYTES)
        )

    def _own(self, analyst: str, job_id: str) -> JobRecord:
        record = self.store.get(job_id) if re.fullmatch(r"[0-9a-f]{32}", job_id) else None
        if record is None or record.analyst != analyst:
            raise JobNotFoundError(f"no training job {job_id!r} of yours")
        return record

    def _message(self, record: JobRecord) -> pb.TrainingJob:
        out = pb.TrainingJob(
            job_id=record.job_id,
            state=_STATE[record.state],
            dataset=record.dataset,
            purpose=record.purpose,
            model=record.model,
            reservation_id=record.reservation_id,
            charged=record.charged,
            error_code=record.error_code,
            error_message=record.error_message,
            epsilon_spent=record.epsilon_spent,
            delta_spent=record.delta_spent,
            steps=record.steps,
            stop_reason=record.stop_reason,
            model_sha256=record.model_sha256,
            model_size=record.model_size,
            policy_sha256=self.policy.sha256,
            submitted_at=record.submitted_at,
            finished_at=record.finished_at,
        )
        if record.state == SUCCEEDED:
            out.receipt = (self.store.output(record.job_id) / "receipt.json").read_bytes()
        return out

    # --- validation: everything that needs no data ---

    def _plan(
        self, analyst: str, request: pb.SubmitTrainingRequest, ledger_key: str, out: Path
    ) -> _Plan:
        """The job's engine configuration (reserving under `ledger_key`, writing to `out`),
        or a ServiceError saying what is wrong."""
        zoo_catalog = self.catalog.training
        if zoo_catalog is None:
            raise TrainingDisabledError("training jobs are not enabled on this service")
        ds = self.engine.authorize(
            analyst, pb.ReleaseRequest(dataset=request.dataset, purpose=request.purpose)
        )
        if ds.training_rows is None:
            raise TrainingDisabledError(
                f"dataset {ds.id} is not declared for training (no training_rows in the catalog)"
            )
        zoo = zoo_catalog.models.get(request.model)
        if zoo is None:
            raise InvalidRequestError(
                f"model {request.model!r} is not in the model zoo; one of "
                f"{sorted(zoo_catalog.models)}"
            )
        label, columns = _columns(ds, request)
        try:  # the engines' integer arithmetic must hold the declared bounds
            training_query(ds, label, columns, b"")
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        names = _feature_names(ds, columns)
        budget = _budget(request)
        params = _params(request.hyperparameters, zoo_catalog, ds.training_rows)
        try:
            config = TrainConfig(
                budget=BudgetConfig(
                    ledger="release-service",
                    subject=ledger_subject(self.service_id, ds.id),
                    purpose=request.purpose,
                    epsilon=budget[0],
                    delta=budget[1],
                    idempotency_key=ledger_key,
                ),
                data=_data_config(ds, label, names),
                training=params,
                output_dir=out,
                model=ModelConfig(hidden=zoo.hidden, activation=zoo.activation, norm=zoo.norm),
                accountant=AccountantConfig(kind=_ACCOUNTANTS[request.hyperparameters.accountant]),
                receipt=ReceiptConfig(
                    signing_key=str(self.setup.signing_key_path),
                    passphrase_env=self.setup.passphrase_env,
                ),
            )
        except TrainingConfigError as exc:
            raise InvalidRequestError(str(exc)) from None
        return _Plan(config, ds, zoo, label, columns, names)

    # --- the workers ---

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._stopping or bool(self._queue))
                if self._stopping:
                    return
                job_id = self._queue.popleft()
                self.metrics.queue.set(len(self._queue))
            self._run(job_id)

    def _run(self, job_id: str) -> None:
        """Run one job to a terminal state; never raises (a bug fails the job, INTERNAL)."""
        record = self.store.update(job_id, state=RUNNING)
        started = time.perf_counter()
        fields: dict[str, Any] = {"job_id": job_id}
        try:
            self._train(record)
        except Exception as exc:  # the job must end in a state; no detail leaves
            log.debug("training job bug", exc_info=True)
            self._after_failure(job_id, "INTERNAL", exc)
        final = self.store.get(job_id)
        assert final is not None
        fields.update(state=final.state, reservation_id=final.reservation_id)
        if final.error_class:
            fields["error"] = final.error_class
        self.metrics.seconds.observe(time.perf_counter() - started)
        log.info("training job finished", extra={"fields": fields})

    def _train(self, record: JobRecord) -> None:
        from fedldp.aggregator.training import (
            BudgetRefusedError,
            TrainingAbortedError,
            UnsupportedModelError,
            train_private,
        )

        request = pb.SubmitTrainingRequest.FromString(record.request_bytes)
        out = self.store.output(record.job_id)
        try:
            plan = self._plan(record.analyst, request, record.ledger_key, out)
        except ServiceError as exc:  # the catalog or policy changed since the submission
            self._fail(record.job_id, "FAILED_PRECONDITION", str(exc), type(exc).__name__)
            return
        try:
            model = _zoo_module(plan)
        except Exception as exc:  # operator code: its text is not sent
            self._fail(
                record.job_id,
                "FAILED_PRECONDITION",
                f"model {plan.zoo.name} of the zoo could not be built ({type(exc).__name__}); "
                "nothing was reserved",
                type(exc).__name__,
            )
            return
        ledger = self.ledger
        if (plan.dataset.id, request.purpose, record.analyst) in self.policy.analyst_caps:
            # the analyst's own cap holds the same (ε, δ), as for releases (holds.py)
            subject = analyst_subject(self.service_id, plan.dataset.id, record.analyst)
            ledger = AnalystCapLedger(self.ledger, subject, request.purpose)
        try:
            result = train_private(
                plan.config,
                ledger=_JobLedger(ledger, self.store, record.job_id),
                model=model,
                load=lambda _data: training_table(plan.dataset, plan.label, plan.columns),
                clock=self.clock,
                log=lambda _msg: None,  # the engine's lines are for a local run's user
            )
        except BudgetRefusedError as exc:
            self._fail(record.job_id, *_refusal(exc), type(exc).__name__)
            return
        except (TrainingConfigError, UnsupportedModelError) as exc:
            self._fail(record.job_id, "INVALID_ARGUMENT", str(exc), type(exc).__name__)
            return
        except TrainingAbortedError as exc:
            self._after_failure(record.job_id, "FAILED_PRECONDITION", exc.__cause__ or exc)
            return
        model_bytes = result.model_path.read_bytes()
        self.store.update(
            record.job_id,
            state=SUCCEEDED,
            finished_at=self.clock(),
            reservation_id=result.reservation_id,
            charged=True,
            epsilon_spent=str(result.epsilon_spent),
            delta_spent=str(result.receipt["privacy"]["delta_spent"]),
            steps=result.steps,
            stop_reason=result.stop_reason,
            model_sha256=hashlib.sha256(model_bytes).hexdigest(),
            model_size=len(model_bytes),
        )
        self.metrics.jobs.labels(SUCCEEDED).inc()

    def _after_failure(self, job_id: str, code: str, exc: BaseException) -> None:
        """FAILED, charged or not as the ledger says (the engine closed the reservation).

        While the service stops (its ledger may be closed under the job) the record
        stays RUNNING: the next start closes the reservation from the ledger's own
        state (`recover`), which this process may no longer be able to read.
        """
        if self._stopping:
            return
        record = self.store.get(job_id)
        assert record is not None
        spent = record.charged
        if record.reservation_id:
            try:
                res = self.ledger.reservation(record.reservation_id)
                spent = res.status == "settled" or res.data_opened_at is not None
            except Exception:  # the ledger is unreachable: report the safe direction
                spent = True
        if spent:
            self._fail(job_id, code, SPENT_MESSAGE, type(exc).__name__, charged=True)
        else:
            self._fail(job_id, "INTERNAL", CANCELLED_MESSAGE, type(exc).__name__)

    def _fail(
        self,
        job_id: str,
        code: str,
        message: str,
        error_class: str,
        reservation_id: str | None = None,
        charged: bool | None = None,
    ) -> None:
        changes: dict[str, Any] = {
            "state": FAILED,
            "finished_at": self.clock(),
            "error_code": code,
            "error_message": message,
            "error_class": error_class,
        }
        if reservation_id is not None:
            changes["reservation_id"] = reservation_id
        if charged is not None:
            changes["charged"] = charged
        self.store.update(job_id, **changes)
        self.metrics.jobs.labels(FAILED).inc()


def _retryable(record: JobRecord) -> bool:
    """A FAILED job that reserved nothing may run again under its key (a refusal
    changes nothing, as for releases); any other job is returned as it is."""
    return record.state == FAILED and not record.reservation_id and not record.charged


def _refusal(exc: BaseException) -> tuple[str, str]:
    """Status code name and message of a ledger refusal (nothing was read)."""
    from fedldp.collector.ledger import (
        CentralBudgetExhaustedError,
        IdempotencyConflictError,
        LedgerError,
        NoCentralCapError,
    )

    cause = exc.__cause__
    codes: Sequence[tuple[type[BaseException], str]] = (
        (CentralBudgetExhaustedError, "RESOURCE_EXHAUSTED"),
        (NoCentralCapError, "FAILED_PRECONDITION"),
        (IdempotencyConflictError, "ALREADY_EXISTS"),
    )
    for cls, code in codes:
        if isinstance(cause, cls):
            return code, f"{cause}; nothing was read or charged"
    if isinstance(cause, LedgerError):
        return "UNAVAILABLE", "the ledger refused the reservation; nothing was read or charged"
    if cause is None:  # ReservationTakenError: the key's reservation belongs to another run
        return "ALREADY_EXISTS", "this job's reservation belongs to another run; nothing was read"
    return "UNAVAILABLE", "the ledger is unavailable; nothing was read or charged"


class _JobLedger:
    """The service's ledger as the engine sees it for one job: every call goes to the
    ledger; the owner token is recorded BEFORE the reservation is asked for, the
    reservation id after, and `charged` once the data-opened mark is committed."""

    def __init__(self, ledger: Any, store: JobStore, job_id: str) -> None:
        self._ledger, self._store, self._job_id = ledger, store, job_id

    def reserve(self, **kwargs: Any) -> Any:
        owner = str(kwargs["owner"])
        self._store.update(self._job_id, owner=owner)
        res = self._ledger.reserve(**kwargs)
        if res.held_by(owner):
            self._store.update(self._job_id, reservation_id=res.id)
        return res

    def open_data(self, reservation_id: str, **kwargs: Any) -> Any:
        res = self._ledger.open_data(reservation_id, **kwargs)
        self._store.update(self._job_id, charged=True)
        return res

    def renew_lease(self, reservation_id: str, **kwargs: Any) -> Any:
        return self._ledger.renew_lease(reservation_id, **kwargs)

    def settle(self, reservation_id: str, **kwargs: Any) -> Any:
        return self._ledger.settle(reservation_id, **kwargs)

    def cancel(self, reservation_id: str, **kwargs: Any) -> Any:
        return self._ledger.cancel(reservation_id, **kwargs)

    def central_events(self, subject: str, purpose: str) -> Sequence[Any]:
        events: Sequence[Any] = self._ledger.central_events(subject, purpose)
        return events

    def ledger_id(self) -> str:
        return str(self._ledger.ledger_id())


# --- request checks ---


def _budget(request: pb.SubmitTrainingRequest) -> tuple[Decimal, Decimal]:
    try:
        epsilon = plain_decimal(request.epsilon, "epsilon")
        delta = plain_decimal(request.delta, "delta")
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    if epsilon <= 0 or not 0 < delta < 1:
        raise InvalidRequestError("DP-SGD needs epsilon > 0 and 0 < delta < 1")
    return epsilon, delta


def _columns(ds: Dataset, request: pb.SubmitTrainingRequest) -> tuple[str, tuple[str, ...]]:
    """The label (a declared categorical column) and the feature columns."""
    label = request.label
    declared = ds.columns.get(label)
    if not isinstance(declared, CategoricalColumn) or len(declared.domain) < 2:
        raise InvalidRequestError(
            f"label {label!r} is not a declared categorical column of dataset {ds.id} with at "
            "least two values"
        )
    features = tuple(request.features) or tuple(c for c in sorted(ds.columns) if c != label)
    unknown = [c for c in features if c not in ds.columns]
    if unknown or label in features or len(set(features)) != len(features) or not features:
        raise InvalidRequestError(
            f"features must be distinct declared columns of dataset {ds.id} other than the label"
        )
    return label, features


def _feature_names(ds: Dataset, columns: Sequence[str]) -> tuple[str, ...]:
    """The model's inputs: a numeric column's name, or "column=value" per domain value."""
    names: list[str] = []
    for column in columns:
        declared = ds.columns[column]
        if isinstance(declared, NumericColumn):
            names.append(column)
        else:
            names.extend(f"{column}={value}" for value in declared.domain)
    return tuple(names)


def _real(name: str, text: str, default: str | None = None) -> Decimal:
    try:
        return plain_decimal(text or default, name)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def _params(hp: pb.TrainingHyperparameters, catalog: TrainingCatalog, rows: int) -> TrainingParams:
    """The hyper-parameters, within the operator's limits (zoo.TrainingLimits)."""
    limits = catalog.limits
    if not 1 <= hp.epochs <= limits.max_epochs:
        raise InvalidRequestError(f"epochs must be 1..{limits.max_epochs}")
    sampling = hp.WhichOneof("sampling")
    if sampling is None:
        raise InvalidRequestError("set expected_batch_size or sample_rate")
    if sampling == "expected_batch_size":
        batch, rate = hp.expected_batch_size, None
        q = Decimal(batch) / Decimal(rows)
    else:
        q = _real("sample_rate", hp.sample_rate)
        batch, rate = None, float(q)
    if not 0 < q <= 1 or q * rows < 1:
        raise InvalidRequestError(
            f"the sampling rate must lie in (0, 1] with an expected batch of at least 1 of the "
            f"dataset's {rows} declared rows"
        )
    if q * rows > limits.max_expected_batch_size:
        raise InvalidRequestError(
            f"the expected batch exceeds the operator's limit {limits.max_expected_batch_size}"
        )
    steps = hp.epochs * int(1 / float(q))
    if steps > limits.max_steps:
        raise InvalidRequestError(
            f"epochs x 1/q = {steps} planned steps exceed the operator's limit {limits.max_steps}"
        )
    lr = _real("learning_rate", hp.learning_rate)
    clip = _real("max_grad_norm", hp.max_grad_norm)
    momentum = _real("momentum", hp.momentum, "0")
    if not 0 < lr <= limits.max_learning_rate:
        raise InvalidRequestError(f"learning_rate must lie in (0, {limits.max_learning_rate}]")
    if not 0 < clip <= limits.max_grad_norm:
        raise InvalidRequestError(f"max_grad_norm must lie in (0, {limits.max_grad_norm}]")
    if not 0 <= momentum < 1:
        raise InvalidRequestError("momentum must lie in [0, 1)")
    if hp.optimizer not in _OPTIMIZERS or hp.accountant not in _ACCOUNTANTS:
        raise InvalidRequestError("unknown optimizer or accountant")
    try:
        return TrainingParams(
            epochs=hp.epochs,
            max_grad_norm=float(clip),
            learning_rate=float(lr),
            expected_batch_size=batch,
            sample_rate=rate,
            optimizer=_OPTIMIZERS[hp.optimizer],
            momentum=float(momentum),
        )
    except TrainingConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def _data_config(ds: Dataset, label: str, names: tuple[str, ...]) -> DataConfig:
    """How the receipt describes the data: the catalog dataset, never a file path or URL
    of the operator's (the service reads the source itself)."""
    unit = f"one {ds.unit} of catalog dataset {ds.id} (one record each, keyed-hash choice)"
    common: dict[str, Any] = {
        "label": label,
        "privacy_unit": unit,
        "features": names,
        "num_classes": len(_domain(ds, label)),
        "rows": ds.training_rows,
    }
    if ds.csv_path is not None:
        return DataConfig(source="csv", path=f"catalog:{ds.id}", **common)
    return DataConfig(source="sql", url=f"catalog://{ds.id}", table=ds.id, **common)


def _domain(ds: Dataset, column: str) -> tuple[str, ...]:
    declared = ds.columns[column]
    assert isinstance(declared, CategoricalColumn)
    return declared.domain


def _zoo_module(plan: _Plan) -> Any:
    """The nn.Module of a `module` zoo entry (None: the engine builds the zoo's MLP)."""
    if plan.zoo.module is None:
        return None
    module_name, _, attr = plan.zoo.module.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    classes = plan.config.data.num_classes
    return factory(len(plan.feature_names), classes)


# --- the training table ---


def training_query(ds: Dataset, label: str, columns: Sequence[str], key: bytes) -> Any:
    """The engines' bounded query of a job's table: ONE row per unit, chosen by the keyed
    hash of `key` (aggregator/engines/plan.py), carrying the label and the features;
    numeric features clamped to their declared bounds by the engine."""
    from fedldp.aggregator.engines.plan import BoundedQuery, NumericSpec

    numeric = {
        c: NumericSpec(d.lower, d.upper, d.scale)
        for c in columns
        if isinstance(d := ds.columns[c], NumericColumn)
    }
    for name, spec in numeric.items():
        spec.check(name)
    return BoundedQuery(
        unit=ds.unit, numeric=numeric, rows_per_unit=1, carry=(label, *columns), key=key
    )


def training_table(
    ds: Dataset, label: str, columns: Sequence[str], key: bytes | None = None
) -> Any:
    """The arrays DP-SGD trains on (module docstring): one record per unit, read by the
    dataset's engine (`training_query`; `key`: the bounding key, fresh from the OS CSPRNG
    by default) into Arrow columns, encoded from the declaration without a row loop:
    labels as positions in the label's domain, rows in a canonical order (sorted by
    features, then label) so the digest does not depend on the engine's order.

    Raises fedldp.aggregator.training.DataError with a fixed message (no value,
    no row) when a value does not fit its declaration; called after the engine
    recorded that the data is opened, so such a failure is charged.
    """
    import numpy as np
    from fedldp.aggregator.engines.plan import EngineError, fresh_key
    from fedldp.aggregator.training.data import DataError, dataset_from_arrays

    query = training_query(ds, label, columns, fresh_key() if key is None else key)
    try:
        table = ds.bounded_table(query)
    except EngineError:
        raise DataError(
            "the dataset's engine could not read the training table (a value that is not a number?)"
        ) from None
    y = _positions(table.column(label), label, _domain(ds, label))
    parts = [_encode(table.column(c), c, ds.columns[c]) for c in columns]
    x = np.hstack(parts) if parts else np.empty((len(y), 0))
    order = np.lexsort((y, *x.T[::-1]))
    names = _feature_names(ds, columns)
    return dataset_from_arrays(x[order], y[order], feature_names=names, label=label)


def _positions(values: Any, column: str, domain: Sequence[str]) -> Any:
    """Each text's position in `domain` (int64); DataError when one is NULL or outside."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from fedldp.aggregator.training.data import DataError

    found = pc.index_in(values, value_set=pa.array(domain, pa.string()))
    if found.null_count:
        raise DataError(f"a value of column {column} lies outside its declared domain")
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def _encode(values: Any, column: str, declared: NumericColumn | CategoricalColumn) -> Any:
    """A column's model inputs (declaration only): one-hot over a categorical domain, or
    the clamped value scaled to [-1, 1]; DataError when a value is missing."""
    import numpy as np
    from fedldp.aggregator.training.data import DataError

    if isinstance(declared, CategoricalColumn):
        at = _positions(values, column, declared.domain)
        return np.eye(len(declared.domain), dtype=np.float64)[at]
    if values.null_count:
        raise DataError(f"a value of column {column} is not a number")
    # value·10^scale (exact integers below 2^53): one correctly rounded division gives
    # the same double as float() of the value's decimal text
    clamped = values.to_numpy(zero_copy_only=False).astype(np.float64) / 10.0**declared.scale
    lower, upper = float(declared.lower), float(declared.upper)
    scaled: Any = 2.0 * (clamped - lower) / (upper - lower) - 1.0
    return scaled.reshape(-1, 1)
