"""The operator's dataset catalog (TOML) and the registration check of each dataset.

The catalog is owned by the operator of the release service, inside the trusted
boundary; analysts never see or supply it. Format (docs/release-service.md)::

    [groups]
    research = ["alice", "bob"]          # group -> analyst subjects

    [datasets.visits]
    csv = "visits.csv"                   # relative to the catalog file; or:
    # sql_url = "postgresql://..."  and  sql_table = "visits"
    unit = "user_id"                     # the privacy-unit column
    contribution_bound = 2               # at most this many records per unit
    [datasets.visits.columns.amount]
    type = "numeric"
    lower = "0"                          # plain decimal strings
    upper = "100"
    [datasets.visits.columns.city]
    type = "categorical"
    domain = ["paris", "lyon"]
    [[datasets.visits.grants]]
    analysts = ["carol"]                 # and/or
    groups = ["research"]
    purposes = ["quarterly-report"]
    # optional: training_rows = 10000    # declared population size: DP-SGD jobs allowed
    # optional: [training] model zoo and limits (zoo.py)

Registration (`Catalog.register`) reads every row once and refuses the dataset
(`RegistrationError`, naming the row number and column, never a value) unless
every unit has at most `contribution_bound` records, every numeric value is a
finite decimal within its declared bounds and every categorical value is in its
domain. Only registered datasets can be queried. Queries still bound and clip
from the declaration (`Dataset.rows`), so data changed after registration can
make a query fail (charged) but never raises a sensitivity.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import io
import operator
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from fedldp.aggregator.central.receipts import HashingReader, file_sha256
from fedldp.aggregator.service.zoo import TrainingCatalog, parse_training
from fedldp.client.textfiles import read_utf8
from fedldp.collector.auth import check_subject

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_DECIMAL_RE = re.compile(r"-?[0-9]+(\.[0-9]+)?")
#: Largest categorical domain (one histogram bin each).
MAX_DOMAIN = 10_000
#: Decimal places of a numeric column when the catalog sets no `scale`.
DEFAULT_SCALE = 6
#: Release engines a dataset may name (`engine`); DuckDB is the default.
ENGINES = ("duckdb", "spark", "python")


def toml_loads(text: str) -> dict[str, Any]:
    """Parse TOML (tomllib; tomli on Python 3.10)."""
    module = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    data: dict[str, Any] = module.loads(text)
    return data


class CatalogError(ValueError):
    """The catalog file is malformed (operator error, at start-up)."""


class RegistrationError(ValueError):
    """A dataset's data do not match its declaration; it cannot be queried."""


def plain_decimal(text: object, name: str) -> Decimal:
    """A Decimal from a plain decimal string ("0.5"; no exponent, no sign but '-')."""
    if not isinstance(text, str) or not _DECIMAL_RE.fullmatch(text):
        raise ValueError(f'{name} must be a plain decimal string such as "0.5"')
    return Decimal(text)


@dataclass(frozen=True)
class NumericColumn:
    """A numeric column with its declared bounds [lower, upper] and fixed-point `scale`
    (decimal places the engines compute with: aggregator/engines/plan.py)."""

    lower: Decimal
    upper: Decimal
    scale: int = DEFAULT_SCALE


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical column with its declared public domain; an empty domain means none
    is public (grouping by it then selects the released groups privately)."""

    domain: tuple[str, ...]


Column = NumericColumn | CategoricalColumn


@dataclass(frozen=True)
class Grant:
    """Analysts (by subject or group) allowed to query for some purposes."""

    analysts: frozenset[str]
    groups: frozenset[str]
    purposes: frozenset[str]


@dataclass
class Dataset:
    """One declared dataset; `registered` once its data matched the declaration."""

    id: str
    unit: str
    contribution_bound: int
    columns: dict[str, Column]
    grants: list[Grant]
    csv_path: Path | None = None
    sql_url: str | None = None
    sql_table: str | None = None
    parquet_path: Path | None = None
    #: The release engine (ENGINES) and, for Spark, its master URL or Spark Connect
    #: endpoint ("local[2]", "spark://host:7077", "sc://host:15002").
    engine: str = "duckdb"
    spark: str | None = None
    #: Grouped queries: L0 (groups one unit may contribute to) and L∞ (rows per group
    #: per unit; default: the contribution bound).
    max_groups_per_unit: int = 1
    max_rows_per_group: int | None = None
    #: The declared (public) population size DP-SGD samples from (q = batch / rows);
    #: None: the dataset cannot be trained on (docs/release-service.md, Training jobs).
    training_rows: int | None = None
    registered: bool = False
    #: SHA-256 of the CSV bytes last read (registration or query).
    sha256: str | None = None
    _digest: str | None = field(default=None, repr=False)
    _digest_stamp: tuple[int, ...] | None = field(default=None, repr=False)

    def purposes_for(self, analyst: str, groups: Mapping[str, frozenset[str]]) -> set[str]:
        """The purposes `analyst` may query this dataset for (empty: no access)."""
        member_of = {g for g, names in groups.items() if analyst in names}
        out: set[str] = set()
        for grant in self.grants:
            if analyst in grant.analysts or member_of & grant.groups:
                out |= grant.purposes
        return out

    # --- reading ---

    def fields(self) -> tuple[str, ...]:
        """The order of the values in every row read: the unit, then the sorted columns."""
        return (self.unit, *sorted(self.columns))

    def index(self, column: str) -> int:
        """Position of `column` in a row read by `bounded_rows`."""
        return self.fields().index(column)

    def _raw_rows(self) -> Iterator[tuple[str, ...]]:
        """Every row as a tuple of texts in `fields()` order; a CSV is hashed while read."""
        if self.csv_path is not None:
            yield from self._csv_rows(self.csv_path)
        elif self.parquet_path is not None:
            yield from self._parquet_rows(self.parquet_path)
        else:
            yield from self._sql_rows()

    def _missing(self, present: Iterable[str]) -> None:
        missing = set(self.fields()) - set(present)
        if missing:
            raise RegistrationError(
                f"dataset {self.id}: the data has no column(s) {sorted(missing)}"
            )

    def _csv_rows(self, path: Path) -> Iterator[tuple[str, ...]]:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            data = io.BufferedReader(HashingReader(fh, digest), buffer_size=1 << 20)
            text = io.TextIOWrapper(data, encoding="utf-8", newline="")
            reader = csv.reader(text)
            header = next(reader, [])
            self._missing(header)
            pick = operator.itemgetter(*(header.index(n) for n in self.fields()))
            try:
                for row in reader:
                    yield pick(row)
            except IndexError:
                raise RegistrationError(
                    f"dataset {self.id}: a row has fewer fields than the header"
                ) from None
            text.read()
        self._digest = digest.hexdigest()

    def _parquet_rows(self, path: Path) -> Iterator[tuple[str, ...]]:
        import pyarrow.parquet as pq

        fh = pq.ParquetFile(path)
        self._missing(fh.schema_arrow.names)
        for batch in fh.iter_batches(columns=list(self.fields())):
            for row in zip(*(batch.column(n).to_pylist() for n in self.fields()), strict=True):
                yield tuple("" if v is None else str(v) for v in row)
        self._digest = self._file_digest(path)

    def _file_digest(self, path: Path) -> str:
        """SHA-256 of the file's bytes, cached while its (inode, size, mtime, ctime) stay."""
        st = path.stat()
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self._digest_stamp != stamp or self._digest is None:
            self._digest = file_sha256(path)
            self._digest_stamp = stamp
        return self._digest

    def source(self) -> Any:
        """Where the engines read the data (aggregator/engines/duck.py sources)."""
        from fedldp.aggregator.engines.duck import FileSource, SqlSource

        if self.csv_path is not None:
            return FileSource(self.csv_path, "csv")
        if self.parquet_path is not None:
            return FileSource(self.parquet_path, "parquet")
        assert self.sql_url is not None and self.sql_table is not None
        return SqlSource(self.sql_url, self.sql_table)

    def aggregate(self, query: Any) -> Any:
        """The bounded aggregation `query` (an engines.plan.BoundedQuery) computed by this
        dataset's engine; only fine-group totals (plan.Result) come back.

        The data digest of a file is its bytes' SHA-256 (cached on the file's stat,
        ctime included, which no user can set back); a SQL table records its name
        (`data_digest`).
        """
        if self.engine == "python":
            from fedldp.aggregator.engines import reference

            result = reference.run(query, self._dict_rows())
        elif self.engine == "spark":
            from fedldp.aggregator.engines import spark

            result = spark.run(query, self.source(), self.spark or "local[2]")
        else:
            from fedldp.aggregator.engines import duck

            result = duck.run(query, self.source())
        for path in (self.csv_path, self.parquet_path):
            if path is not None:
                self._file_digest(path)
        return result

    def _dict_rows(self) -> Iterator[dict[str, str | None]]:
        """Rows as {column: text or None} (the reference engine's input)."""
        names = self.fields()
        for row in self._raw_rows():
            yield {n: (v if v != "" else None) for n, v in zip(names, row, strict=True)}

    def _sql_rows(self) -> Iterator[tuple[str, ...]]:
        import sqlalchemy as sa

        assert self.sql_url is not None and self.sql_table is not None
        engine = sa.create_engine(self.sql_url)
        try:
            table = sa.Table(self.sql_table, sa.MetaData(), autoload_with=engine)
            self._missing(c.name for c in table.columns)
            with engine.connect() as conn:
                result = conn.execution_options(stream_results=True).execute(
                    sa.select(*(table.c[n] for n in self.fields()))
                )
                for row in result:
                    yield tuple("" if v is None else str(v) for v in row)
        finally:
            engine.dispose()
        self._digest = None

    def data_digest(self) -> str:
        """SHA-256 of the CSV as last read ("sql-table:<table>" for SQL)."""
        if self.csv_path is None and self.parquet_path is None:
            return f"sql-table:{self.sql_table}"
        assert self._digest is not None, "the data was not read to its end"
        return self._digest

    def bounded_rows(self, per_unit: int | None = None) -> Iterator[tuple[str, ...]]:
        """Rows (`fields()` order), keeping at most `per_unit` (default `contribution_bound`)
        per unit: the first ones read.

        Removing a unit then removes at most k rows: the sensitivity the
        release functions are calibrated to (releases.py, contribution_bound);
        DP-SGD, whose guarantee is per row, reads with per_unit = 1.
        """
        seen: dict[str, int] = {}
        k = self.contribution_bound if per_unit is None else per_unit
        for row in self._raw_rows():
            n = seen.get(row[0], 0)
            if n < k:
                seen[row[0]] = n + 1
                yield row

    # --- registration ---

    def register(self) -> None:
        """Validate every row against the declaration; mark the dataset queryable.

        Raises RegistrationError naming the first violation (row number and
        column, never the value).
        """
        per_unit: dict[str, int] = {}
        checks = [(i, name, self.columns[name]) for i, name in enumerate(self.fields()) if i]
        for number, row in enumerate(self._raw_rows(), start=2):
            unit = row[0]
            if not unit:
                raise RegistrationError(
                    f"dataset {self.id}: row {number} has an empty privacy unit ({self.unit})"
                )
            per_unit[unit] = per_unit.get(unit, 0) + 1
            if per_unit[unit] > self.contribution_bound:
                raise RegistrationError(
                    f"dataset {self.id}: a unit has more than {self.contribution_bound} "
                    f"records (contribution bound), first seen at row {number}"
                )
            for i, name, column in checks:
                problem = _check_value(column, row[i])
                if problem:
                    raise RegistrationError(
                        f"dataset {self.id}: row {number}, column {name}: {problem}"
                    )
        self.sha256 = self._digest
        self.registered = True


def _check_value(column: Column, text: str | None) -> str | None:
    """Why `text` violates `column`'s declaration, or None (never quotes the value)."""
    if isinstance(column, CategoricalColumn):
        if not column.domain:
            return None
        return None if text in column.domain else "value outside the declared domain"
    try:
        value = Decimal(text or "")
    except InvalidOperation:
        return "value is not a number"
    if not value.is_finite():
        return "value is not finite"
    if not column.lower <= value <= column.upper:
        return "value outside the declared bounds"
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > column.scale:
        return f"value has more than the column's {column.scale} decimal places (scale)"
    return None


# --- the catalog file ---


@dataclass
class Catalog:
    """Datasets by id, and analyst groups."""

    datasets: dict[str, Dataset]
    groups: dict[str, frozenset[str]]
    #: The `[training]` section (model zoo and limits); None: no training jobs.
    training: TrainingCatalog | None = None

    def register_all(self) -> dict[str, str]:
        """Register every dataset; {dataset id: refusal message} of those refused."""
        refused: dict[str, str] = {}
        for ds in self.datasets.values():
            try:
                ds.register()
            except (RegistrationError, OSError) as exc:
                refused[ds.id] = str(exc)  # a row number and a check, or a path: no value
            except ValueError as exc:  # e.g. a decoding error, whose text quotes the bytes
                refused[ds.id] = f"dataset {ds.id}: cannot read its data ({type(exc).__name__})"
        return refused

    def grants(self, dataset: str, purpose: str, analyst: str) -> bool:
        """Whether the catalog grants `analyst` `purpose` on `dataset` (directly or by group)."""
        ds = self.datasets.get(dataset)
        return ds is not None and purpose in ds.purposes_for(analyst, self.groups)

    def check_registered(self) -> None:
        """Register every dataset; RegistrationError (one line, naming each refused dataset
        and the check it failed, never a value) when any is refused.

        The service starts only when every declared dataset registers: whether a
        dataset registers is a function of its rows, so serving the others and
        hiding it would release that bit to analysts for free.
        """
        refused = self.register_all()
        if refused:
            raise RegistrationError(
                "the service serves every catalog dataset or none; fix the data or its "
                "declaration: " + "; ".join(refused[d] for d in sorted(refused))
            )


def load_catalog(path: Path) -> Catalog:
    """Parse a catalog file (module docstring); CatalogError on any malformed entry."""
    try:
        data = toml_loads(read_utf8(path, "a catalog is a UTF-8 TOML file", CatalogError))
    except CatalogError:
        raise
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read catalog {path}: {exc}") from None
    section = "the catalog"
    try:
        groups = {str(g): _group(str(g), names) for g, names in _table(data, "groups").items()}
        datasets = {}
        for name, spec in _table(data, "datasets").items():
            section = f"[datasets.{name}]"
            datasets[str(name)] = _dataset(str(name), dict(spec), path.parent)
        section = "[training]"
        training = parse_training(dict(data["training"])) if "training" in data else None
    except (ValueError, KeyError) as exc:
        raise CatalogError(f"catalog {path}: {exc}") from None
    except TypeError as exc:  # e.g. a number where a table or a list belongs
        raise CatalogError(
            f"catalog {path}: {section} has a value of the wrong type ({exc}); "
            "docs/release-service.md lists each key and its type"
        ) from None
    unknown = set(data) - {"groups", "datasets", "training"}
    if unknown:
        raise CatalogError(f"catalog {path}: unknown section(s) {sorted(unknown)}")
    return Catalog(datasets, groups, training)


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    """The catalog's section `key` ({} when absent); ValueError when it is not a table."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"[{key}] must be a table (a [{key}] section), not {value!r}")
    return value


def _group(name: str, names: Any) -> frozenset[str]:
    """The analysts of group `name`; ValueError unless it is a list of names."""
    if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
        raise ValueError(
            f'[groups] {name} must be a list of analyst names, e.g. {name} = ["alice"]'
        )
    return frozenset(check_subject(a) for a in names)


def _dataset(name: str, spec: dict[str, Any], base: Path) -> Dataset:
    if not _ID_RE.fullmatch(name):
        raise ValueError(f"dataset id {name!r} must be 1-128 of [A-Za-z0-9_.-]")
    allowed = {
        "csv",
        "sql_url",
        "sql_table",
        "unit",
        "contribution_bound",
        "columns",
        "grants",
        "training_rows",
        "parquet",
        "engine",
        "spark",
        "max_groups_per_unit",
        "max_rows_per_group",
    }
    if set(spec) - allowed:
        raise ValueError(f"dataset {name}: unknown key(s) {sorted(set(spec) - allowed)}")
    bound = spec.get("contribution_bound")
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(f"dataset {name}: contribution_bound must be a positive integer")
    unit = spec.get("unit")
    if not isinstance(unit, str) or not unit:
        raise ValueError(f"dataset {name}: unit (the privacy-unit column) is required")
    columns = {str(c): _column(name, str(c), dict(s)) for c, s in spec["columns"].items()}
    if not columns or unit in columns:
        raise ValueError(f"dataset {name}: declare at least one column, not the unit column")
    grants = [_grant(name, dict(g)) for g in spec.get("grants", [])]
    has_csv, has_sql = "csv" in spec, "sql_url" in spec or "sql_table" in spec
    if has_csv + has_sql + ("parquet" in spec) != 1:
        raise ValueError(f"dataset {name}: give exactly one of csv, parquet or sql_url + sql_table")
    csv_path = (base / str(spec["csv"])) if has_csv else None
    engine = str(spec.get("engine", "duckdb"))
    if engine not in ENGINES:
        raise ValueError(f"dataset {name}: engine must be one of {', '.join(ENGINES)}")
    limits = {k: spec.get(k) for k in ("max_groups_per_unit", "max_rows_per_group")}
    for key, value in limits.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"dataset {name}: {key} must be a positive integer")
    rows = spec.get("training_rows")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f"dataset {name}: training_rows must be a positive integer")
    return Dataset(
        name,
        unit,
        bound,
        columns,
        grants,
        csv_path=csv_path,
        sql_url=str(spec["sql_url"]) if has_sql else None,
        sql_table=str(spec["sql_table"]) if has_sql else None,
        training_rows=rows,
        parquet_path=(base / str(spec["parquet"])) if "parquet" in spec else None,
        engine=engine,
        spark=str(spec["spark"]) if "spark" in spec else None,
        max_groups_per_unit=limits["max_groups_per_unit"] or 1,
        max_rows_per_group=limits["max_rows_per_group"],
    )


def _column(dataset: str, name: str, spec: dict[str, Any]) -> Column:
    kind = spec.get("type")
    where = f"dataset {dataset}, column {name}"
    if kind == "numeric":
        lower = plain_decimal(spec.get("lower"), f"{where}: lower")
        upper = plain_decimal(spec.get("upper"), f"{where}: upper")
        if not lower < upper:
            raise ValueError(f"{where}: lower must be below upper")
        scale = spec.get("scale", DEFAULT_SCALE)
        if isinstance(scale, bool) or not isinstance(scale, int) or not 0 <= scale <= 12:
            raise ValueError(f"{where}: scale must be an integer 0-12 (decimal places)")
        places = max(-int(b.as_tuple().exponent) for b in (lower, upper))
        if places > scale:
            raise ValueError(f"{where}: the bounds have more decimal places than scale {scale}")
        return NumericColumn(lower, upper, scale)
    if kind == "categorical":
        domain = tuple(str(v) for v in spec.get("domain", ()))
        if "domain" not in spec:
            return CategoricalColumn(())  # no public domain
        if not domain or len(set(domain)) != len(domain) or len(domain) > MAX_DOMAIN:
            raise ValueError(f"{where}: domain must be 1-{MAX_DOMAIN} distinct values")
        return CategoricalColumn(domain)
    raise ValueError(f"{where}: type must be 'numeric' or 'categorical'")


def _grant(dataset: str, spec: dict[str, Any]) -> Grant:
    purposes = frozenset(str(p) for p in spec.get("purposes", ()))
    if not purposes:
        raise ValueError(f"dataset {dataset}: every grant names at least one purpose")
    return Grant(
        frozenset(check_subject(str(a)) for a in spec.get("analysts", ())),
        frozenset(str(g) for g in spec.get("groups", ())),
        purposes,
    )
