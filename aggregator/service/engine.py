"""The release engine: one authorized ReleaseRequest -> one charged, signed release.

No gRPC here (server.py wraps it). For each request, in order:

1. authorize: the dataset is registered and the catalog grants the analyst the
   request's purpose on it (else `PermissionDeniedError`, the same message
   whether or not the dataset exists); the release policy has a cap for
   (dataset, purpose); when it also gives this analyst an own cap there, the
   release is charged against both (holds.py);
2. validate the query against the declaration (column, type, ε, δ, mechanism);
3. run the release with fedldp.aggregator.central.releases (claim in the
   ledger under the service's own subject "<service id>/<dataset>" -> open_data
   -> read -> settle; the refund rule of issue 15), with the contribution bound
   and clipping bounds taken from the catalog, never from the request;
4. build the receipt from the ledger (receipts.release_receipt), sign it with
   the service's key, and derive the error bars from the ledger event (public
   noise parameters and outputs only).

The true aggregate exists only inside the release function's `compute`; this
module never sees it. Errors raised after the data was opened carry a fixed
message (`ReleaseAfterReadError`), never the underlying exception's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central import quantile as qm
from fedldp.aggregator.central import releases as rel
from fedldp.aggregator.central.datakey import DataKey, KeyedDigest
from fedldp.aggregator.central.receipts import release_receipt
from fedldp.aggregator.central.signing import RELEASE_RECEIPT_TYPE, canonical_json, sign
from fedldp.aggregator.engines.plan import (
    GRID,
    BoundedQuery,
    NumericSpec,
    Result,
    Split,
    Totals,
    cells,
    fresh_key,
    merge,
)
from fedldp.aggregator.engines.sqlparse import SqlRefusedError
from fedldp.aggregator.service import errorbars
from fedldp.aggregator.service.catalog import (
    Catalog,
    CategoricalColumn,
    Dataset,
    NumericColumn,
    plain_decimal,
)
from fedldp.aggregator.service.holds import AnalystCapLedger
from fedldp.aggregator.service.policy import ReleasePolicy, analyst_subject, ledger_subject
from fedldp.aggregator.service.sqlrelease import plan_sql, run_sql
from fedldp.aggregator.service.sqlrelease import response as sql_response
from fedldp.client.policy.envelope import key_id_of
from fedldp.collector.ledger import LedgerError
from fedldp.v1 import release_pb2 as pb

R = TypeVar("R")
_KEY_RE = re.compile(r"[\x21-\x7e]{1,128}")  # always used with fullmatch
#: Smallest ε a request may ask for: below it the noise scale and error bars
#: leave floating point (and no release at that ε is useful).
MIN_EPSILON = Decimal("0.000000000001")
#: Most significant digits of ε and δ: a mean's halves (one more digit) stay
#: exact in the default 28-digit Decimal context the ledger and verifiers use.
MAX_DIGITS = 27


class ServiceError(Exception):
    """A refusal whose message is safe to send to the analyst."""


class PermissionDeniedError(ServiceError):
    """The analyst may not query this dataset for this purpose."""


class InvalidRequestError(ServiceError):
    """The request is malformed or does not fit the dataset's declaration."""


class NoCapError(ServiceError):
    """The release policy sets no cap for (dataset, purpose)."""


class ReleaseAfterReadError(ServiceError):
    """The release failed after the data was opened: charged, nothing released."""


@dataclass(frozen=True)
class _Query:
    kind: str
    column: str | None
    quantile: Decimal | None = None


def _keyed(key: DataKey | None, digest: Callable[[], str]) -> Callable[[], KeyedDigest] | None:
    """The keyed data binding of a dataset read (None: record nothing about the data)."""
    if key is None:
        return None
    return lambda: key.digest("dataset", digest())


class ReleaseEngine:
    """Authorizes, runs and signs releases for authenticated analysts."""

    def __init__(
        self,
        catalog: Catalog,
        policy: ReleasePolicy,
        ledger: Any,
        signing_key: Ed25519PrivateKey,
        service_id: str,
        clock: Callable[[], int],
        data_key: DataKey | None = None,
    ) -> None:
        """`data_key` keys the data binding in receipts and ledger events (an HMAC of
        the dataset's digest, aggregator/central/datakey.py); without it nothing
        about the data is recorded, never a plain digest of protected data."""
        self.catalog, self.policy, self.ledger = catalog, policy, ledger
        self.key, self.service_id, self.clock = signing_key, service_id, clock
        self.data_key = data_key

    # --- listing ---

    def datasets_for(self, analyst: str) -> pb.ListDatasetsResponse:
        """Registered datasets the analyst may query, with their declarations."""
        out = pb.ListDatasetsResponse()
        for ds in sorted(self.catalog.datasets.values(), key=lambda d: d.id):
            purposes = ds.purposes_for(analyst, self.catalog.groups)
            if not ds.registered or not purposes:
                continue
            info = out.datasets.add(
                dataset=ds.id,
                purposes=sorted(purposes),
                contribution_bound=ds.contribution_bound,
            )
            for name, col in sorted(ds.columns.items()):
                if isinstance(col, NumericColumn):
                    info.columns.add(
                        name=name, type="numeric", lower=str(col.lower), upper=str(col.upper)
                    )
                else:
                    info.columns.add(name=name, type="categorical", domain=list(col.domain))
        return out

    # --- releasing ---

    def authorize(self, analyst: str, request: pb.ReleaseRequest) -> Dataset:
        """The dataset, when the analyst may query it for the request's purpose."""
        ds = self.catalog.datasets.get(request.dataset)
        if (
            ds is None
            or not ds.registered
            or request.purpose not in ds.purposes_for(analyst, self.catalog.groups)
        ):
            raise PermissionDeniedError(
                f"no dataset {request.dataset!r} is open to you for purpose {request.purpose!r}"
            )
        if (ds.id, request.purpose) not in self.policy.caps:
            raise NoCapError(
                f"the release policy sets no cap for dataset {ds.id!r}, purpose {request.purpose!r}"
            )
        return ds

    def release(self, analyst: str, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        """Run one release (module docstring); raises ServiceError or a ledger/release error."""
        if request.WhichOneof("query") == "sql":
            return self._release_sql(analyst, request)
        ds = self.authorize(analyst, request)
        query = _query_of(request, ds)
        epsilon, delta = _budget(request)
        ledger, common = self._charging(analyst, ds, request, epsilon)
        opened = [False]

        def rows() -> None:
            opened[0] = True

        result = _guarded(opened, lambda: _run(ledger, query, request, ds, common, delta, rows))
        return self._response(result)

    def _charging(
        self, analyst: str, ds: Dataset, request: pb.ReleaseRequest, epsilon: Decimal
    ) -> tuple[Any, dict[str, Any]]:
        """The ledger to charge (with the analyst's own cap when the policy sets one) and
        the release functions' request fields."""
        if not _KEY_RE.fullmatch(request.idempotency_key):
            raise InvalidRequestError("idempotency_key must be 1-128 printable ASCII characters")
        ledger = self.ledger
        if (ds.id, request.purpose, analyst) in self.policy.analyst_caps:
            subject = analyst_subject(self.service_id, ds.id, analyst)
            ledger = AnalystCapLedger(self.ledger, subject, request.purpose)
        common: dict[str, Any] = {
            "subject": ledger_subject(self.service_id, ds.id),
            "purpose": request.purpose,
            "epsilon": epsilon,
            "idempotency_key": ledger_key(analyst, request.idempotency_key),
            "now": self.clock(),
            "data_digest": _keyed(self.data_key, ds.data_digest),
            "contribution_bound": ds.contribution_bound,
            "receipt_key_id": key_id_of(self.key.public_key()),
        }
        return ledger, common

    def _release_sql(self, analyst: str, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        """A DP SQL release (sqlrelease.py): parsed and planned before any reservation."""
        open_ds = {
            d.id: d
            for d in self.catalog.datasets.values()
            if d.registered and request.purpose in d.purposes_for(analyst, self.catalog.groups)
        }
        try:
            plan = plan_sql(request.sql.sql, open_ds)
        except SqlRefusedError as exc:
            raise InvalidRequestError(f"SQL refused: {exc}") from None
        if request.dataset and request.dataset != plan.table:
            raise InvalidRequestError("the request's dataset differs from the SQL's FROM")
        ds = self.authorize(analyst, pb.ReleaseRequest(dataset=plan.table, purpose=request.purpose))
        if request.mechanism not in (pb.NOISE_MECHANISM_UNSPECIFIED, pb.NOISE_MECHANISM_LAPLACE):
            raise InvalidRequestError("SQL releases use the Laplace mechanism: leave it unset")
        epsilon, delta = _budget(request)
        ledger, common = self._charging(analyst, ds, request, epsilon)
        common["query"] = {"sql": request.sql.sql}
        opened = [False]

        def mark() -> None:
            opened[0] = True

        result = _guarded(opened, lambda: run_sql(ledger, ds, plan, delta, common, mark))
        table = canonical_json(result.table).decode()
        receipt = release_receipt(self.ledger, result.reservation_id, value=table)
        envelope = canonical_json(sign(RELEASE_RECEIPT_TYPE, receipt, self.key))
        return sql_response(result, envelope, self.policy.sha256)

    def _response(self, result: rel.CentralRelease) -> pb.ReleaseResponse:
        receipt = release_receipt(self.ledger, result.reservation_id, value=str(result.value))
        envelope = sign(RELEASE_RECEIPT_TYPE, receipt, self.key)
        out = pb.ReleaseResponse(
            kind=result.kind,
            reservation_id=result.reservation_id,
            receipt=canonical_json(envelope),
            policy_sha256=self.policy.sha256,
        )
        events = {str(e.get("query")): e for e in receipt["events"]}
        if result.kind in ("count", "sum"):
            value = Decimal(str(result.value))
            _add(out, result.kind, value, errorbars.additive(events[result.kind], value))
        elif result.kind == "mean":
            _add_mean(out, result, events, receipt["ledger"]["metadata"])
        elif result.kind == "histogram":
            event = events["histogram"]
            for label, value in json.loads(str(event["output"])).items():
                v = Decimal(value)
                _add(out, label, v, errorbars.additive(event, v))
        elif result.kind == "quantile":
            _add_quantile(out, result, events["quantile"])
        else:
            out.chosen = str(result.value)
        return out


def _guarded(opened: list[bool], run: Callable[[], R]) -> R:
    """`run()`, with its data-independent refusals as InvalidRequestError and any error
    after the data was opened as ReleaseAfterReadError (fixed message: charged)."""
    try:
        return run()
    except (rel.ReleaseError, ServiceError, LedgerError):
        raise
    except (ValueError, TypeError, ArithmeticError) as exc:
        if opened[0]:
            raise ReleaseAfterReadError(
                "the release failed after the data was opened; its budget is spent and "
                "nothing was released"
            ) from None
        if isinstance(exc, SqlRefusedError):
            raise InvalidRequestError(f"SQL refused: {exc}") from None
        raise InvalidRequestError(str(exc)) from None


def _add(out: pb.ReleaseResponse, label: str, value: Decimal, bar: errorbars.ErrorBar) -> None:
    out.values.add(
        label=label,
        value=str(value),
        error=pb.ErrorBar(
            noise_stddev=bar.noise_stddev,
            confidence=str(bar.confidence),
            lower=str(bar.lower),
            upper=str(bar.upper),
        ),
    )


def _add_mean(
    out: pb.ReleaseResponse,
    result: rel.CentralRelease,
    events: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    part = "centred_sum" if "centred_sum" in result.parts else "sum"  # a replay may be older
    s, c = result.parts[part], result.parts["count"]
    lower, upper = Decimal(str(meta["lower"])), Decimal(str(meta["upper"]))
    bar = errorbars.mean(
        errorbars.additive(events[part], s),
        errorbars.additive(events["count"], c),
        s,
        c,
        lower,
        upper,
        offset=rel.centre_of(lower, upper) if part == "centred_sum" else Decimal(0),
    )
    _add(out, "mean", Decimal(str(result.value)), bar)


def _add_quantile(
    out: pb.ReleaseResponse, result: rel.CentralRelease, event: dict[str, Any]
) -> None:
    bar = errorbars.quantile(event)
    out.values.add(
        label="quantile",
        value=str(result.value),
        rank_error=pb.RankErrorBar(
            confidence=str(bar.confidence), records=str(bar.records), grid_step=str(bar.grid_step)
        ),
    )


def _budget(request: pb.ReleaseRequest) -> tuple[Decimal, Decimal]:
    try:
        epsilon = plain_decimal(request.epsilon, "epsilon")
        delta = plain_decimal(request.delta or "0", "delta")
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    if epsilon < MIN_EPSILON or delta < 0 or delta >= 1:
        raise InvalidRequestError(f"epsilon must be at least {MIN_EPSILON} and 0 <= delta < 1")
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if len(value.as_tuple().digits) > MAX_DIGITS:
            raise InvalidRequestError(
                f"{name} may have at most {MAX_DIGITS} significant digits (a mean halves it: "
                "its halves must stay exact in the 28-digit arithmetic of every reader)"
            )
    return epsilon, delta


def _query_of(request: pb.ReleaseRequest, ds: Dataset) -> _Query:
    """The query kind and its column, checked against the declaration."""
    kind = request.WhichOneof("query")
    if kind is None:
        raise InvalidRequestError("the request names no query (count, sum, mean, ...)")
    if kind == "count":
        return _Query(kind, None)
    column = str(getattr(request, kind).column)
    declared = ds.columns.get(column)
    wanted = NumericColumn if kind in ("sum", "mean", "quantile") else CategoricalColumn
    if not isinstance(declared, wanted):
        what = "numeric" if wanted is NumericColumn else "categorical"
        raise InvalidRequestError(
            f"{kind} needs a declared {what} column of dataset {ds.id}; {column!r} is not one"
        )
    if kind == "quantile":
        return _Query(kind, column, _quantile_of(request.quantile.quantile))
    return _Query(kind, column)


def _quantile_of(text: str) -> Decimal:
    """The requested q: a plain decimal in (0, 1) with at most 6 places."""
    try:
        q = plain_decimal(text, "quantile")
        qm.quantile_fraction(q)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    return q


def _mechanism(request: pb.ReleaseRequest, query: _Query) -> str | None:
    m = request.mechanism
    if query.kind in ("choice", "quantile"):
        if m != pb.NOISE_MECHANISM_UNSPECIFIED:
            raise InvalidRequestError(
                f"a {query.kind} uses the exponential mechanism: leave mechanism unset"
            )
        return None
    names = {pb.NOISE_MECHANISM_LAPLACE: "laplace", pb.NOISE_MECHANISM_GAUSSIAN: "gaussian"}
    if m not in names:
        raise InvalidRequestError("mechanism must be LAPLACE or GAUSSIAN")
    if query.kind == "histogram" and m != pb.NOISE_MECHANISM_LAPLACE:
        raise InvalidRequestError("a histogram uses the Laplace mechanism (pure epsilon-DP)")
    return names[m]


def _run(
    ledger: Any,
    query: _Query,
    request: pb.ReleaseRequest,
    ds: Dataset,
    common: dict[str, Any],
    delta: Decimal,
    rows: Callable[[], object],
) -> rel.CentralRelease:
    """Dispatch to the release function of `query` (bounds and domain from the catalog)."""
    mechanism = _mechanism(request, query)
    if query.kind in ("choice", "histogram", "quantile") and delta != 0:
        raise InvalidRequestError(f'a {query.kind} is pure epsilon-DP: delta must be "0"')
    col = query.column or ""
    common = {**common, "query": _query_params(query)}
    values = _bounded_load(ds, query, rows)

    if query.kind == "count":
        return rel.private_count(
            ledger, load=values, mechanism=mechanism or "", delta=delta, **common
        )
    declared = ds.columns[col]
    if isinstance(declared, NumericColumn) and query.quantile is not None:
        return rel.private_quantile(
            ledger,
            load=values,
            quantile=query.quantile,
            lower=declared.lower,
            upper=declared.upper,
            **common,
        )
    if isinstance(declared, NumericColumn):
        fn = rel.private_sum if query.kind == "sum" else rel.private_mean
        return fn(
            ledger,
            load=values,
            lower=declared.lower,
            upper=declared.upper,
            mechanism=mechanism or "",
            delta=delta,
            **common,
        )
    if query.kind == "histogram":
        return rel.private_histogram(ledger, domain=declared.domain, load=values, **common)
    return rel.private_choice(ledger, candidates=declared.domain, load=values, **common)


def bounded_query(ds: Dataset, query: _Query) -> BoundedQuery:
    """The engine's bounded aggregation for an ungrouped query (aggregator/engines/plan.py):
    at most k rows per unit chosen by a fresh keyed hash, values clamped to the bounds."""
    col = query.column
    declared = ds.columns.get(col) if col else None
    numeric: dict[str, NumericSpec] = {}
    split: Split | None = None
    sums: tuple[str, ...] = ()
    domains: dict[str, tuple[str, ...]] = {}
    if col is not None and isinstance(declared, NumericColumn):
        numeric[col] = NumericSpec(declared.lower, declared.upper, declared.scale)
        numeric[col].check(col)
        if query.kind == "quantile":
            split = Split(col, "cells")
        else:
            sums = (col,)
    elif col is not None and isinstance(declared, CategoricalColumn):
        split = Split(col, "values")
        domains[col] = declared.domain
    return BoundedQuery(
        unit=ds.unit,
        numeric=numeric,
        sums=sums,
        split=split,
        rows_per_unit=ds.contribution_bound,
        domains=domains,
        key=fresh_key(),
    )


def _bounded_load(
    ds: Dataset, query: _Query, opened: Callable[[], object]
) -> Callable[[], rel.Bounded]:
    """`load` of the release functions: the dataset's engine computes the bounded
    aggregate (after `opened()` marked the data read); only a `Bounded` comes back."""
    plan = bounded_query(ds, query)

    def load() -> rel.Bounded:
        opened()
        result: Result = ds.aggregate(plan)
        col = query.column
        if plan.split is not None and plan.split.kind == "cells":
            on, between = cells(result, 0).get((), ([0] * (GRID + 1), [0] * (GRID + 1)))
            return rel.Bounded(cells=(on, between))
        if plan.split is not None:
            counts = {str(k[0]): t.rows for k, t in result.items() if k[0] is not None}
            return rel.Bounded(counts=counts)
        total = merge(result, 0).get((), Totals())
        if col is None:
            return rel.Bounded(count=total.rows)
        scale = plan.numeric[col].scale
        return rel.Bounded(
            count=total.counts.get(col, 0),
            total=Decimal(total.sums.get(col, 0)).scaleb(-scale),
        )

    return load


def _query_params(query: _Query) -> dict[str, str]:
    """The query's parameters recorded in the reservation and the receipt (column, q).

    With the kind, bounds, mechanism, ε and δ the ledger already records, they
    make an idempotency key reused for any other query a conflict.
    """
    out = {"column": query.column} if query.column is not None else {}
    if query.quantile is not None:
        out["quantile"] = str(query.quantile)
    return out


def ledger_key(analyst: str, key: str) -> str:
    """The ledger's idempotency key of an analyst's key: scoped to the analyst.

    The analyst's name is length-prefixed, so no (analyst, key) pair can
    produce another pair's ledger key (a subject may contain ':'), and one
    analyst can never fetch another's release by guessing its key.
    """
    return f"release-service:{len(analyst)}:{analyst}:{key}"
