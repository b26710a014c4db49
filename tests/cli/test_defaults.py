"""Safe, fast defaults: `processes` follows the usable cores; explicit settings win."""

from __future__ import annotations

import os
from pathlib import Path

from fedldp.collector.config import default_processes, load_config


def test_processes_defaults_to_the_usable_cores(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[collector]\nledger_url = "sqlite:////tmp/x.db"\n', encoding="utf-8")
    usable = len(os.sched_getaffinity(0))
    assert default_processes() == max(1, min(64, usable))
    assert load_config(config, env={}).processes == default_processes()
    assert load_config(config, env={"FEDLDP_COLLECTOR_PROCESSES": "1"}).processes == 1
    config.write_text(config.read_text(encoding="utf-8") + "processes = 3\n", encoding="utf-8")
    assert load_config(config, env={}).processes == 3
