"""The device SDK runs on the bare install: grpcio, protobuf, cryptography, stdlib."""

from __future__ import annotations

import ast
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
    "fedldp.client.mechanisms.sketch",
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


CLIENT_ROOT = REPO_ROOT / "client"
#: Names that only signing needs: the private-key type and private-key loading.
SIGNING_NAMES = frozenset({"Ed25519PrivateKey", "load_pem_private_key", "private_bytes"})


def signing_uses(source: str) -> list[str]:
    """The signing code paths in `source`: authoring imports and signing names (by AST,
    so documentation that mentions them does not count)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedldp.authoring"):
            found.append(f"import from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"import {a.name}" for a in node.names if a.name.startswith("fedldp.authoring")
            ]
        elif isinstance(node, ast.alias) and node.name in SIGNING_NAMES:
            found.append(node.name)
        elif isinstance(node, ast.Name) and node.id in SIGNING_NAMES:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in SIGNING_NAMES:
            found.append(f".{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sign"
        ):
            found.append(".sign()")
    return found


def test_importing_the_device_package_loads_no_authoring_code() -> None:
    """Devices verify, never sign: no device module imports `fedldp.authoring`."""
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import fedldp, fedldp.client
        for info in pkgutil.walk_packages(fedldp.client.__path__, "fedldp.client."):
            importlib.import_module(info.name)
        fedldp.Client
        loaded = sorted(m for m in sys.modules if m.startswith("fedldp.authoring"))
        assert not loaded, loaded
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_signing_code_path_under_the_device_package() -> None:
    """No private-key type, signing call or authoring import anywhere under client/."""
    offenders = {
        str(path.relative_to(REPO_ROOT)): uses
        for path in sorted(CLIENT_ROOT.rglob("*.py"))
        if (uses := signing_uses(path.read_text()))
    }
    assert offenders == {}


def test_the_signing_scan_catches_a_planted_signer() -> None:
    """The broken variant: a device module that signs is reported, documentation is not."""
    planted = textwrap.dedent(
        '''
        """Mentions Ed25519PrivateKey and fedldp.authoring in prose only."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from fedldp.authoring.signing import sign_envelope

        def sign(key: Ed25519PrivateKey, data: bytes) -> bytes:
            return key.sign(data)
        '''
    )
    assert signing_uses('"""Ed25519PrivateKey, fedldp.authoring, key.sign()."""') == []
    uses = signing_uses(planted)
    assert "import from fedldp.authoring.signing" in uses
    assert "Ed25519PrivateKey" in uses
    assert ".sign()" in uses
