"""The device SDK runs on the bare install: grpcio, protobuf, cryptography, stdlib."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from server_extras import SERVER_MODULES

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


# --- the `fedldp` script on light installs (issue 29, item 5) ---


_POLICIES = ("--policies", "{tmp}", "--trust", "{tmp}")
#: Commands of the issue's light-install review, each past its argument checks.
CLI_ONLY_COMMANDS = [
    ["ledger", "show", "alice", "--ledger", "sqlite:///{tmp}/ledger.db"],
    [
        *("release", "count", "--purpose", "p", "--epsilon", "1", "--key", "k"),
        *("--ledger", "sqlite:///{tmp}/ledger.db", "--subject", "s", "--data", "{tmp}/data.txt"),
    ],
    ["train", "--config", str(REPO_ROOT / "deploy" / "examples" / "train.toml")],
    ["verify", "mechanism", "-m", "grr", "--samples", "10"],
    ["collector", "serve", "--config", "{tmp}/collector.toml"],
    ["dashboard", "--ledger", "sqlite:///{tmp}/ledger.db", *_POLICIES],
    ["ledger", "init", "--ledger", "sqlite:///{tmp}/new.db"],
]

_CLI_ONLY_CHILD = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing it raises ModuleNotFoundError
from click.testing import CliRunner
from fedldp.cli import main
out = []
for args in {commands!r}:
    result = CliRunner().invoke(main, args)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    out.append([args, result.exit_code, result.stderr, escaped])
print(json.dumps(out))
"""


def test_the_script_without_click_names_the_cli_extra() -> None:
    """The bare install has the `fedldp` script but not click: one line, exit 1."""
    code = (
        "import sys\n"
        "sys.modules['click'] = None\n"
        "sys.argv = ['fedldp', '--help']\n"
        "from fedldp.launcher import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "Error: the fedldp command line needs 'click', from the 'cli' extra: pip install "
        "'fedldp[cli]' (from a checkout: pip install '.[cli]')"
    ]


def test_the_script_is_the_launcher() -> None:
    """pyproject's script goes through fedldp.launcher (which needs no click)."""
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fedldp": "fedldp.launcher:main"}
    code = "import sys; sys.modules['click'] = None; import fedldp.launcher, fedldp.cli_errors"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_with_only_the_cli_extra_every_command_names_its_extra(tmp_path: Path) -> None:
    """`[cli]` alone: each command that needs more says which extra, in one line, exit 1
    (not 70 "internal error (ModuleNotFoundError ...)")."""
    (tmp_path / "data.txt").write_text("1\n2\n", encoding="utf-8")
    (tmp_path / "collector.toml").write_text("[collector]\n", encoding="utf-8")
    commands = [[a.format(tmp=tmp_path) for a in args] for args in CLI_ONLY_COMMANDS]
    code = _CLI_ONLY_CHILD.format(blocked=SERVER_MODULES, commands=commands)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    problems = []
    for args, exit_code, stderr, escaped in json.loads(done.stdout):
        lines = [line for line in stderr.splitlines() if line.startswith("Error: ")]
        if escaped or exit_code != 1 or len(lines) != 1 or "pip install 'fedldp[" not in lines[0]:
            problems.append(f"fedldp {' '.join(args)}: exit {exit_code}\n{stderr}")
    assert not problems, "\n".join(problems)
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "new.db").exists()


def test_every_extra_named_for_a_module_brings_it() -> None:
    """EXTRA_OF_MODULE names, for each module, an extra of pyproject.toml that lists it."""
    from fedldp.cli_errors import EXTRA_OF_MODULE

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    distribution = {"sklearn": "scikit-learn", "grpc_health": "grpcio-health-checking"}
    for module, extra in EXTRA_OF_MODULE.items():
        wanted = distribution.get(module, module.replace("_", "-")).lower()
        names = [re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0].lower() for dep in extras[extra]]
        assert wanted in names, f"{module}: {wanted} is not in the {extra!r} extra"
