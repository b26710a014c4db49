"""Run mypy (strict, config in pyproject.toml) over the fedldp packages, bench/, scripts/,
conformance/ and tests/ (all of it, strictly: no module is exempt).

The source folders map onto `fedldp.*` through setuptools' editable-install import
hook, which mypy cannot follow. This script lays out a shadow tree of symlinks,
build/typecheck/fedldp/{client,collector,aggregator,v1,...}, so mypy sees the
installed package layout, then checks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHADOW = REPO_ROOT / "build" / "typecheck"
# Package (below fedldp) -> source folder, as in setup.py.
SUBPACKAGES = {
    "client": REPO_ROOT / "client",
    "collector": REPO_ROOT / "collector",
    "aggregator": REPO_ROOT / "aggregator",
    "authoring": REPO_ROOT / "authoring",
    "v1": REPO_ROOT / "proto" / "fedldp" / "v1",
}


def build_shadow() -> Path:
    """(Re)create the symlink tree; return the folder to put on MYPYPATH."""
    if SHADOW.exists():
        shutil.rmtree(SHADOW)
    package = SHADOW / "fedldp"
    package.mkdir(parents=True)
    for entry in (REPO_ROOT / "fedldp").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in SUBPACKAGES.items():
        (package / name).symlink_to(folder, target_is_directory=True)
    return SHADOW


def main() -> int:
    shadow = build_shadow()
    env = dict(os.environ, MYPYPATH=str(shadow))
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO_ROOT / "pyproject.toml")]
    # Files mode from inside the shadow tree: mypy walks the symlinked folders.
    status = subprocess.call([*command, "fedldp"], cwd=shadow, env=env)
    folders = ("bench", "scripts", "conformance")
    others = [str(REPO_ROOT / name) for name in folders if (REPO_ROOT / name).is_dir()]
    status = status or subprocess.call([*command, *others], cwd=REPO_ROOT, env=env)
    # tests/: as pytest imports them (a folder's *_testkit helpers are top-level modules).
    kits = sorted({str(p.parent) for p in (REPO_ROOT / "tests").rglob("*_testkit.py")})
    tests_env = dict(env, MYPYPATH=os.pathsep.join([str(shadow), str(REPO_ROOT), *kits]))
    return status or subprocess.call(
        [*command, "--explicit-package-bases", "tests"], cwd=REPO_ROOT, env=tests_env
    )


if __name__ == "__main__":
    sys.exit(main())
