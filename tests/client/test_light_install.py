"""The device SDK runs on the bare install: grpcio, protobuf, cryptography, stdlib."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

# tomllib from Python 3.11; the collector extra's backport, tomli, on 3.10.
tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")


REPO_ROOT = Path(__file__).resolve().parents[2]

# Modules a device must never need; blocked in the child interpreter.
HEAVY = ["numpy", "scipy", "sqlalchemy", "click", "torch", "opacus", "matplotlib", "psycopg"]
# The device-side modules that must import with only the base install.
DEVICE_MODULES = [
    "fedldp",
    "fedldp.client",
    "fedldp.client.mechanisms",
    "fedldp.client.wire",
    "fedldp.client.policy",
    "fedldp.client.sdk",
]


def test_base_dependencies_are_the_sdk_only() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(
        dep.split(">")[0].split("=")[0].split("<")[0].strip() for dep in project["dependencies"]
    )
    assert names == ["cryptography", "grpcio", "protobuf"]


def test_device_modules_import_without_heavy_dependencies() -> None:
    code = textwrap.dedent(
        f"""
        import importlib, sys
        for name in {HEAVY!r}:
            sys.modules[name] = None  # any import of it raises ImportError
        for module in {DEVICE_MODULES!r}:
            importlib.import_module(module)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
