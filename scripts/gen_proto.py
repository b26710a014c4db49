"""Regenerate the Python bindings from proto/fedldp/v1/*.proto.

Run with the pinned generator from the `dev` extra (grpcio-tools==1.85.1,
mypy-protobuf==5.1.0): ``python scripts/gen_proto.py``. The output is committed;
tests/proto/test_codegen.py regenerates into a temporary folder and fails on any
difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILES = sorted(
    p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "fedldp" / "v1").glob("*.proto")
)


def generate(out_dir: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto under out_dir."""
    from grpc_tools import protoc  # dev extra only

    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *PROTO_FILES,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit status {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=PROTO_ROOT, help="output root (default: proto/)"
    )
    args = parser.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
