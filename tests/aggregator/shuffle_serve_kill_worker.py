"""A `shuffler serve` step the kill -9 test stops at a stage (run with `python FILE`).

    python shuffle_serve_kill_worker.py SHUFFLER_TOML STAGE NOW

Runs one step of the daemon (`Shuffler.step`, the body `fedldp shuffler serve` repeats) at
time NOW; when it reaches STAGE ("pulled", "permuted", "written", "recorded", "manifest"),
prints the stage's name, flushes, and blocks reading stdin, so the test kills it there.
"""

from __future__ import annotations

import sys

from fedldp.aggregator.shuffler_config import load
from fedldp.aggregator.shuffler_service import Shuffler

from fedldp.cli_common import open_cli_ledger


def main() -> None:
    """Run one step that stops at the named stage."""
    config_path, stop_at, now = sys.argv[1:4]

    def on_stage(name: str) -> None:
        if name == stop_at:
            print(name, flush=True)
            sys.stdin.read()  # blocks until the test kills this process

    daemon = Shuffler(
        load(config_path),
        lambda url: open_cli_ledger(url, "read", scope="whole"),
        on_stage=on_stage,
    )
    daemon.step(int(now))


if __name__ == "__main__":
    main()
