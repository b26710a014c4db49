"""CLI start-up figures: CPU seconds of `fedldp --help` and of usage errors.

    python -m bench.cli_startup [--quick] [--json PATH] [--runs N]

What is measured (medians over >= 5 runs, with min and max): for each command of
`COMMANDS`, the CPU time (user + system, from the child's rusage) and the wall
time of one `fedldp ...` process, from its start to its exit, and the heavy
modules it imported (torch, Opacus, SciPy, SQLAlchemy...: see `HEAVY`; read from
`sys.modules` at exit by a wrapper that runs the same entry point as the
`fedldp` script). Every command is refused at its arguments (a usage error, a
missing option or file, a missing token) and should cost well under the 0.5 s
target of issue 29; none may import the training stack. References in the same
run: an empty interpreter (`python -c pass`) and `import click` (the floor of
any click command line).

CPU time is the portable figure: wall time includes waiting for a core on a
loaded machine. `--quick` runs the same commands 5 times each (< 1 minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import Timing, format_table, summarize, write_json

# The heavy modules a start-up path must not import (the training stack first).
HEAVY = [
    "torch",
    "opacus",
    "sklearn",
    "scipy",
    "numpy",
    "sqlalchemy",
    "matplotlib",
    "dp_accounting",
    "duckdb",
    "pyarrow",
    "pyspark",
    "starlette",
    "uvicorn",
    "fedldp.aggregator.training.engine",
    "fedldp.aggregator.service.server",
    "fedldp.collector.ledger",
]
#: What `fedldp --help` must not import either (the RPC and policy stacks).
HELP_HEAVY = [*HEAVY, "grpc", "fedldp.authoring", "fedldp.client.mechanisms"]

_SERVICE = ["--service", "127.0.0.1:1", "--purpose", "p", "--epsilon", "1", "--key", "k"]

#: (label, arguments after `fedldp`): the help pages and usage errors measured.
COMMANDS: list[tuple[str, list[str]]] = [
    ("--help", ["--help"]),
    ("--version", ["--version"]),
    ("unknown command", ["no-such-command"]),
    ("train --config missing.toml", ["train", "--config", "missing.toml"]),
    ("train (no --config)", ["train"]),
    (
        "release mean --service (no token)",
        ["release", "mean", *_SERVICE, "--column", "c", "--dataset", "d"],
    ),
    ("release count exponent", ["release", "count", "--purpose", "p", "--epsilon", "1e-3"]),
    ("release sql --service (no token)", ["release", "sql", "SELECT COUNT(*) FROM d", *_SERVICE]),
    ("release-service query (no --quantile)", ["release-service", "query", "quantile", *_SERVICE]),
    ("ledger set-cap not a number", ["ledger", "set-cap", "s", "p", "--epsilon", "x"]),
    ("collector mint-token --ttl -5", ["collector", "mint-token", "d", "--ttl", "-5"]),
    ("verify mechanism --max-bytes 0", ["verify", "mechanism", "-m", "pem", "--max-bytes", "0"]),
    ("demo unknown scenario", ["demo", "--scenario", "words"]),
    ("keys rotate (no --current)", ["keys", "rotate"]),
    ("policy show missing file", ["policy", "show", "/nonexistent/p.policy"]),
    ("client outbox (no --state-dir)", ["client", "outbox"]),
]

#: Runs `fedldp ARGS` through the script's entry point, then prints the heavy modules
#: it imported (one JSON line on fd 3, so the command's own output stays apart).
_WRAPPER = """
import json, os, sys
heavy = json.loads(sys.argv[1])
sys.argv = ["fedldp", *sys.argv[2:]]
from fedldp.launcher import main
try:
    main()
except SystemExit:
    pass
with os.fdopen(3, "w") as out:
    out.write(json.dumps([m for m in heavy if m in sys.modules]))
"""


def _measure(argv: list[str], *, pass_fd: int | None = None) -> tuple[float, float, int]:
    """CPU seconds (user + system), wall seconds and exit code of one process."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FEDLDP_")}
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment,
        pass_fds=() if pass_fd is None else (pass_fd,),
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, wall, process.returncode


def fedldp_script() -> str:
    """The `fedldp` script beside this interpreter."""
    return str(Path(sys.executable).with_name("fedldp"))


def imported_heavy(args: list[str], heavy: list[str]) -> list[str]:
    """The modules of `heavy` that `fedldp ARGS` imported (a fresh interpreter)."""
    read, write = os.pipe()
    try:
        os.set_inheritable(write, True)
        code = f"import os; os.dup2({write}, 3); exec({_WRAPPER!r})"
        _measure([sys.executable, "-c", code, json.dumps(heavy), *args], pass_fd=write)
    finally:
        os.close(write)
    with os.fdopen(read) as source:
        text = source.read()
    return list(json.loads(text)) if text else ["(the wrapper printed nothing)"]


def measure_commands(runs: int) -> list[dict[str, Any]]:
    """Each command's CPU and wall time over `runs` runs, its exit code and heavy imports."""
    script = fedldp_script()
    rows: list[dict[str, Any]] = []
    references = [
        ("(reference) python -c pass", [sys.executable, "-c", "pass"]),
        ("(reference) import click", [sys.executable, "-c", "import click"]),
    ]
    for label, argv in [*references, *((lab, [script, *a]) for lab, a in COMMANDS)]:
        samples = [_measure(argv) for _ in range(runs)]
        heavy = HELP_HEAVY if label == "--help" else HEAVY
        rows.append(
            {
                "command": label,
                "argv": argv[1:] if argv[0] == script else argv,
                "cpu_s": summarize([s[0] for s in samples]),
                "wall_s": summarize([s[1] for s in samples]),
                "exit_code": samples[-1][2],
                "heavy_imported": [] if argv[0] != script else imported_heavy(argv[1:], heavy),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    def cell(t: Timing) -> str:
        return f"{t.median:.3f} ({t.min:.3f}-{t.max:.3f})"

    return format_table(
        ["command", "CPU s, median (min-max)", "wall s", "exit", "heavy modules imported"],
        [
            [
                r["command"],
                cell(r["cpu_s"]),
                f"{r['wall_s'].median:.3f}",
                r["exit_code"],
                ", ".join(r["heavy_imported"]) or "-",
            ]
            for r in rows
        ],
    )


def main(argv: list[str] | None = None) -> int:
    """Print the table; --json writes every figure."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cli_startup",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--quick", action="store_true", help="5 runs per command (< 1 minute)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--runs", type=int, default=None, help="runs per command (>= 5)")
    args = parser.parse_args(argv)
    runs = max(5, args.runs or (5 if args.quick else 15))
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-cli-") as tmp:
        os.chdir(tmp)  # `missing.toml` and friends resolve in an empty folder
        rows = measure_commands(runs)
    print(f"CLI start-up, {runs} runs per command (CPU = user + system of the process)\n")
    print(_table(rows))
    over = [r["command"] for r in rows if r["cpu_s"].median >= 0.5]
    heavy = [r["command"] for r in rows if r["heavy_imported"]]
    print(f"\nover 0.5 s CPU: {', '.join(over) or 'none'}")
    print(f"heavy imports: {', '.join(heavy) or 'none'}")
    if args.json:
        write_json(
            args.json,
            benchmark="cli_startup",
            params={"runs": runs, "quick": args.quick},
            figures=rows,
            packages=("click", "grpcio", "torch"),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
