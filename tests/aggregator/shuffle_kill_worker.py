"""A shuffler process the kill -9 test stops at a stage (run with `python FILE`).

    python shuffle_kill_worker.py SPOOL BATCH OUT_DIR STAGE

Releases BATCH from the spool into OUT_DIR; when the release reaches STAGE ("permuted",
"written"), prints the stage's name on stdout, flushes, and blocks reading stdin, so the test
(which reads that line) kills it with SIGKILL exactly there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedldp.aggregator.shuffler import ShuffleSpool, release


def main() -> None:
    """Run one release that stops at the named stage."""
    spool_path, batch, out_dir, stop_at = sys.argv[1:5]

    def on_stage(name: str) -> None:
        if name == stop_at:
            print(name, flush=True)
            sys.stdin.read()  # blocks until the test kills this process

    release(ShuffleSpool(Path(spool_path)), batch, Path(out_dir), min_batch=1, on_stage=on_stage)


if __name__ == "__main__":
    main()
