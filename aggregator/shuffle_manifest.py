"""The manifest the shuffler writes beside a released batch file, for the analyzer.

`BATCH.shuffled.manifest.json` (beside `BATCH.shuffled`) states, for one release:

    {"schema": "fedldp.shuffle.manifest/v1", "batch": key, "count": ciphertexts released,
     "sha256": hex SHA-256 of the batch file, "collector_count": sealed reports the
     collector's ledger held for the batch at the last pull before the release (null when
     the batch never came from a ledger pull), "policy_id", "policy_version",
     "window_start" (null unless the key is POLICY.vVERSION.WINDOW)}

Who vouches for `collector_count`: the shuffler, which read it from the ledger (read-only)
and recorded it in its spool in the same transaction as the ciphertexts it added
(`ShuffleSpool.add`). It spares the operator typing `--collector-count` and catches a
shuffler that released more than the ledger held by mistake; a shuffler that lies is not
caught by its own manifest: an analyzer that does not trust the shuffler takes the count
from the collector's operator (`--collector-count`, docs/shuffle.md).

Compatibility: fields are only ever added; a reader ignores fields it does not know.
The file is written through a temporary name, fsync and rename; its content depends only
on the spool's records, so writing it again (after a crash) gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fedldp.aggregator.shuffler import ShuffleSpool, _fsync_dir, read_batch

MANIFEST_SCHEMA = "fedldp.shuffle.manifest/v1"
_WINDOW_KEY = re.compile(r"(.+)\.v([0-9]+)\.([0-9]+)")


@dataclass(frozen=True)
class Manifest:
    """A batch file's manifest (see the module docstring)."""

    batch: str
    count: int
    sha256: str
    collector_count: int | None
    policy_id: str | None = None
    policy_version: int | None = None
    window_start: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON layout (schema fedldp.shuffle.manifest/v1)."""
        return {
            "schema": MANIFEST_SCHEMA,
            "batch": self.batch,
            "count": self.count,
            "sha256": self.sha256,
            "collector_count": self.collector_count,
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "window_start": self.window_start,
        }


def manifest_path(batch_file: Path) -> Path:
    """Where the manifest of `batch_file` lies: beside it, NAME.manifest.json."""
    batch_file = Path(batch_file)
    return batch_file.with_name(batch_file.name + ".manifest.json")


def parse_window_batch(batch: str) -> tuple[str, int, int] | None:
    """(policy id, version, window start) of a POLICY.vVERSION.WINDOW key, else None."""
    match = _WINDOW_KEY.fullmatch(batch)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))


def write_manifest(spool: ShuffleSpool, batch: str, batch_file: Path) -> Path:
    """Write (or rewrite, to the same bytes) the manifest of `batch`, released to
    `batch_file`; its path. Raises ValueError when the spool has not released `batch`."""
    released = spool.released(batch)
    if released is None:
        raise ValueError(f"batch {batch} is not released: no manifest")
    window = parse_window_batch(batch)
    manifest = Manifest(
        batch,
        released[0],
        released[1],
        spool.ledger_count(batch),
        *(window if window is not None else (None, None, None)),
    )
    path = manifest_path(batch_file)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest.to_dict(), indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def read_manifest(batch_file: Path) -> Manifest | None:
    """The manifest beside `batch_file` (None when there is none).

    Raises ValueError when it is not a manifest (not JSON, another schema, a field of the
    wrong type, a negative collector count) or does not belong to the file: another SHA-256
    (the file was changed or replaced), another batch key or count than the file's header.
    """
    path = manifest_path(batch_file)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not a JSON manifest") from exc
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"{path} is not a {MANIFEST_SCHEMA} manifest")
    released, collector = doc.get("count"), doc.get("collector_count")
    if (
        not isinstance(doc.get("batch"), str)
        or not isinstance(doc.get("sha256"), str)
        or type(released) is not int
        or not (collector is None or (type(collector) is int and collector >= 0))
    ):
        raise ValueError(f"{path}: batch, sha256, count or collector_count has the wrong type")
    data = Path(batch_file).read_bytes()
    if doc["sha256"] != hashlib.sha256(data).hexdigest():
        raise ValueError(f"{path} describes another file (SHA-256 differs from {batch_file})")
    key, ciphertexts = read_batch(Path(batch_file))
    if doc["batch"] != key or released != len(ciphertexts):
        raise ValueError(f"{path} names another batch or count than {batch_file}")
    window = parse_window_batch(key)
    return Manifest(
        key,
        released,
        doc["sha256"],
        collector,
        *(window if window is not None else (None, None, None)),
    )
