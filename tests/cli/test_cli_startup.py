"""Start-up paths import nothing heavy (issue 29, item 6), checked by module inspection.

Each command of bench/cli_startup.py's COMMANDS (`fedldp --help`, usage errors,
`fedldp train --config missing.toml`, `fedldp release mean --service ...`) runs in
a fresh interpreter through the `fedldp` script's entry point; afterwards
`sys.modules` must hold none of the heavy modules (torch, Opacus, SciPy,
SQLAlchemy, the training engine, the release service...). No timing is asserted:
`python -m bench.cli_startup` prints the CPU seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli_startup import COMMANDS, HEAVY, HELP_HEAVY, imported_heavy


@pytest.mark.parametrize(("label", "args"), COMMANDS, ids=[label for label, _ in COMMANDS])
def test_start_up_paths_import_nothing_heavy(
    label: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `missing.toml` is missing here
    assert imported_heavy(args, HELP_HEAVY if label == "--help" else HEAVY) == []


def test_the_inspection_sees_what_a_command_imports() -> None:
    """The inspection is not blind: modules every run imports are reported."""
    assert imported_heavy(["--help"], ["fedldp.cli", "click", "no.such.module"]) == [
        "fedldp.cli",
        "click",
    ]
