"""Run the ```sh examples of README.md and docs/*.md: the docs are contracts.

Each ```sh block runs as one `bash -euo pipefail` script, in file order, in one
temporary working folder per file (so a file's blocks may build on each other,
as a reader following the page would). The folder holds a `deploy` link to the
repository's deploy/, and, when a block mentions `fedldp-demo`, the output of
`fedldp demo --devices 400` (the README's demo environment). `fedldp` is this
checkout's. Example passphrases ROOT_PASS and POLICY_PASS are set.

A block that needs something outside (root on the host, a network install, a
long-running service) is skipped with its reason, either by a marker line
``<!-- docs-check: skip REASON -->`` right before its fence, or by `SKIPS`
below (for README.md, which the lead edits). Exit status 1 if any block fails;
the output lists every block run or skipped, with the reason.

Usage: python scripts/check_docs.py [FILE.md ...]   (default: README.md docs/*.md)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"(?:<!--\s*docs-check:\s*skip\s+(?P<reason>.*?)\s*-->\s*\n)?```sh\n(?P<body>.*?)```",
    re.S,
)
#: (file name, text in the block) -> why the block is not run here.
SKIPS: dict[tuple[str, str], str] = {
    ("README.md", "make demo"): "the quickstart itself (CI runs make lint/docs/test; "
    "this script runs `fedldp demo` for the demo environment)",
    ("README.md", "make test  "): "CI runs make lint, make docs and make test itself (.ci/run)",
    ("README.md", "/etc/fedldp"): "an operator's host: writes /etc/fedldp (root) and "
    "`collector serve` runs until stopped",
    ("collector.md", "pip install"): "installs from the network; the checkout is installed",
    ("operations.md", "pip install"): "installs from the network; the checkout is installed",
    ("operations.md", "docker build"): "needs a container engine (docker/podman)",
    ("operations.md", "cd deploy/compose"): "needs docker compose",
    ("operations.md", "kubectl"): "needs a Kubernetes cluster",
    ("operations.md", "/etc/fedldp/collector.toml /backups"): "an operator's host "
    "(/etc/fedldp, /backups, a PostgreSQL server at db:5432)",
}
TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class Block:
    """One ```sh block: where it is, its text, and why it is skipped (None: run it)."""

    path: Path
    line: int
    body: str
    skip: str | None


def blocks(path: Path) -> list[Block]:
    """The ```sh blocks of `path`, in order."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        body = match.group("body")
        reason = match.group("reason")
        for (name, needle), why in SKIPS.items():
            if reason is None and path.name == name and needle in body:
                reason = why
        line = text.count("\n", 0, match.start("body"))
        found.append(Block(path, line, body, reason))
    return found


def demo_environment(work: Path, env: dict[str, str]) -> None:
    """`fedldp demo` into work/fedldp-demo (what the README's later commands inspect)."""
    subprocess.run(
        ["fedldp", "demo", "--devices", "400", "--processes", "1", "--out", "fedldp-demo"],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
        timeout=TIMEOUT_SECONDS,
    )


def run_file(path: Path, env: dict[str, str]) -> list[str]:
    """Run the blocks of `path`; return the failures (and print what happened)."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="fedldp-docs-") as tmp:
        work = Path(tmp)
        (work / "deploy").symlink_to(REPO_ROOT / "deploy", target_is_directory=True)
        demo_ready = False
        for block in blocks(path):
            where = f"{path.relative_to(REPO_ROOT)}:{block.line + 1}"
            if block.skip is not None:
                print(f"SKIP {where}: {block.skip}")
                continue
            if "fedldp-demo" in block.body and not demo_ready:
                demo_environment(work, env)
                demo_ready = True
            started = time.monotonic()
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.body],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
            )
            took = time.monotonic() - started
            if result.returncode != 0 or "Traceback" in result.stderr:
                failures.append(
                    f"{where}: exit {result.returncode}\n{block.body}\n{result.stderr[-2000:]}"
                )
                print(f"FAIL {where} ({took:.1f} s)")
            else:
                print(f"ok   {where} ({took:.1f} s)")
    return failures


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or [
        REPO_ROOT / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
    ]
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(ROOT_PASS="docs-check root passphrase", POLICY_PASS="docs-check policy pass")
    env = {k: v for k, v in env.items() if not k.startswith("FEDLDP_COLLECTOR_")}
    failures = [f for path in files for f in run_file(path, env)]
    for failure in failures:
        print(f"\n--- {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
