"""Reading the training table (CSV, Parquet or a SQL table) and its digest.

Nothing here is called before the ledger reservation succeeds (engine.py). The
dataset digest is computed over a canonical encoding of what training sees, so
it is the same whichever source held the rows:

    sha256( b"fedldp-dataset-v1\\n"
            + canonical JSON {"features": [...], "label": ..., "rows": n, "columns": d}
            + b"\\n" + features as float64 little-endian, row-major
            + labels as int64 little-endian )

For files, the receipt also carries the sha256 of the file's bytes. SQL rows are
read in ascending order of (label, features...) so the order, and therefore the
digest, does not depend on the database's physical layout.

Compatibility: the digest's encoding is versioned by its prefix; a change makes
a new prefix, never a new meaning for an old one.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.aggregator.central.receipts import file_sha256
from fedldp.aggregator.training.config import DataConfig
from fedldp.client.textfiles import not_text
from numpy.typing import NDArray

DIGEST_PREFIX = b"fedldp-dataset-v1\n"


class DataError(ValueError):
    """The training data cannot be read or does not match the configuration."""


@dataclass(frozen=True)
class Dataset:
    """The training table as arrays, with its provenance.

    `features` is float32 (n, d); `labels` int64 (n,) in [0, num_classes).
    `n_rows` is the population the privacy guarantee is stated over.
    """

    features: NDArray[np.float32]
    labels: NDArray[np.int64]
    feature_names: tuple[str, ...]
    label_name: str
    digest: str
    source_sha256: str | None

    @property
    def n_rows(self) -> int:
        """Number of rows (examples)."""
        return int(self.labels.shape[0])

    @property
    def num_features(self) -> int:
        """Number of feature columns."""
        return int(self.features.shape[1])

    declared_classes: int | None = None

    @property
    def num_classes(self) -> int:
        """The declared class count ([data] num_classes) when given; otherwise inferred as
        max label + 1, which depends on the data (never used to shape a released model)."""
        if self.declared_classes is not None:
            return self.declared_classes
        return int(self.labels.max()) + 1 if self.n_rows else 0


def dataset_digest(
    features: NDArray[np.floating], labels: NDArray[np.integer], names: Sequence[str], label: str
) -> str:
    """The canonical dataset digest (module docstring), hex."""
    header = json.dumps(
        {
            "features": list(names),
            "label": label,
            "rows": int(labels.shape[0]),
            "columns": int(features.shape[1]),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    h = hashlib.sha256(DIGEST_PREFIX)
    h.update(header + b"\n")
    h.update(np.ascontiguousarray(features, dtype="<f8").tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()


def _columns_from_rows(
    header: Sequence[str], rows: Sequence[Sequence[object]], config: DataConfig
) -> Dataset:
    names = list(header)
    if len(set(names)) != len(names):
        raise DataError("the table has duplicate column names")
    if config.label not in names:
        raise DataError(f"label column {config.label!r} is not in the table")
    if config.unit_column is not None and config.unit_column not in names:
        raise DataError(f"unit column {config.unit_column!r} is not in the table")
    if config.features is not None:
        missing = [f for f in config.features if f not in names]
        if missing:
            raise DataError(f"feature columns not in the table: {', '.join(missing)}")
        features = list(config.features)
    else:
        features = [c for c in names if c not in (config.label, config.unit_column)]
    if not features:
        raise DataError("no feature columns")
    if not rows:
        raise DataError("the table has no rows")
    index = {c: i for i, c in enumerate(names)}
    n = len(rows)
    x = np.empty((n, len(features)), dtype=np.float64)
    y = np.empty(n, dtype=np.int64)
    units: list[object] = []
    for r, row in enumerate(rows):
        if len(row) != len(names):
            # Row numbers, never values: a raw value must not reach an error message.
            raise DataError(f"row {r + 1} has {len(row)} fields, expected {len(names)}")
        for j, col in enumerate(features):
            try:
                value = float(row[index[col]])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise DataError(f"row {r + 1}, column {col!r}: not a number") from None
            if not math.isfinite(value):
                raise DataError(f"row {r + 1}, column {col!r}: not finite")
            x[r, j] = value
        raw_label = row[index[config.label]]
        try:
            label_value = float(raw_label)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise DataError(f"row {r + 1}: the label is not an integer class id") from None
        if not label_value.is_integer() or label_value < 0:
            raise DataError(f"row {r + 1}: the label is not an integer class id >= 0")
        if config.num_classes is not None and label_value >= config.num_classes:
            # Neither the row nor the value: the failure is charged and must say little.
            raise DataError(
                f"a label lies outside 0..{config.num_classes - 1} "
                f"([data] num_classes = {config.num_classes}); the run is charged"
            )
        y[r] = int(label_value)
        if config.unit_column is not None:
            units.append(row[index[config.unit_column]])
    if config.unit_column is not None and len(set(units)) != len(units):
        raise DataError(
            f"unit column {config.unit_column!r} repeats a unit: the guarantee is per row, "
            "so each privacy unit must occupy at most one row (aggregate per unit first)"
        )
    digest = dataset_digest(x, y, features, config.label)
    return Dataset(
        features=x.astype(np.float32),
        labels=y,
        feature_names=tuple(features),
        label_name=config.label,
        digest=digest,
        source_sha256=None,
        declared_classes=config.num_classes,
    )


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise DataError(f"{path} is empty") from None
            return [h.strip() for h in header], [row for row in reader if row]
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{not_text(path, exc)}; [data] source "
            '= "csv" reads a UTF-8 CSV file (a binary file: source = "parquet")'
        ) from None


def _read_parquet(path: Path) -> tuple[list[str], list[list[object]]]:
    try:
        pq: Any = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise DataError(
            "reading Parquet needs pyarrow, which fedldp does not install; "
            "pip install pyarrow, or export the table to CSV"
        ) from exc
    table = pq.read_table(path)
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return list(table.column_names), [list(r) for r in zip(*columns, strict=True)]


def _read_sql(
    url: str, table_name: str, config: DataConfig
) -> tuple[list[str], list[list[object]]]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        table = sa.Table(table_name, sa.MetaData(), autoload_with=engine)
        names = [c.name for c in table.columns]
        if config.features is not None:
            order = [config.label, *config.features]
        else:
            order = [
                config.label,
                *(c for c in names if c not in (config.label, config.unit_column)),
            ]
        order = [c for c in order if c in names]
        stmt = sa.select(table).order_by(*(table.c[c] for c in order))
        with engine.connect() as conn:
            rows = [list(r) for r in conn.execute(stmt)]
    except sa.exc.NoSuchTableError:
        raise DataError(f"table {table_name!r} does not exist") from None
    except sa.exc.SQLAlchemyError as exc:
        raise DataError(f"reading table {table_name!r} failed: {type(exc).__name__}") from None
    finally:
        engine.dispose()
    return names, rows


def redact_url(url: str) -> str:
    """The SQLAlchemy URL with its password hidden (for receipts and messages)."""
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable url>"


def load_dataset(config: DataConfig) -> Dataset:
    """Open the configured source and return the training table (module docstring).

    Raises DataError with a message that names rows and columns, never values.
    """
    if config.source in ("csv", "parquet"):
        assert config.path is not None
        path = Path(config.path)
        if not path.is_file():
            raise DataError(f"data file {path} does not exist")
        header, rows = _read_csv(path) if config.source == "csv" else _read_parquet(path)
        data = _columns_from_rows(header, rows, config)
        return dataclasses.replace(data, source_sha256=file_sha256(path))
    assert config.url is not None and config.table is not None
    header, rows = _read_sql(config.url, config.table, config)
    return _columns_from_rows(header, rows, config)


def dataset_from_arrays(
    features: NDArray[Any],
    labels: NDArray[Any],
    *,
    feature_names: Sequence[str] | None = None,
    label: str = "label",
) -> Dataset:
    """A Dataset from in-memory arrays (Python API, examples, tests), digested the same way."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels)
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise DataError("features must be (n, d) and labels (n,), n >= 1")
    if not np.all(np.isfinite(x)):
        raise DataError("features must be finite")
    if not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
        raise DataError("labels must be integer class ids >= 0")
    names = (
        tuple(feature_names)
        if feature_names is not None
        else tuple(f"x{i}" for i in range(x.shape[1]))
    )
    if len(names) != x.shape[1]:
        raise DataError("feature_names must name every column")
    y64 = y.astype(np.int64)
    return Dataset(
        features=x.astype(np.float32),
        labels=y64,
        feature_names=names,
        label_name=label,
        digest=dataset_digest(x, y64, names, label),
        source_sha256=None,
    )
