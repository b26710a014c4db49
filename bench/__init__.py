"""fedldp benchmarks: `python -m bench.<name> --help` (see BENCHMARKS.md and docs/)."""
