"""The `fedldp` script's entry point (pyproject.toml, [project.scripts]).

The bare install (the device SDK) ships the script without click: instead of a
traceback, the script then says in one line which extra to install (exit 1, like
every refusal of fedldp/cli_errors.py). With click present it is `fedldp.cli:main`.
This module imports nothing outside the standard library and fedldp.cli_errors.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run the command line, or name the missing extra in one line (exit 1)."""
    try:
        from fedldp.cli import main as cli
    except ModuleNotFoundError as exc:
        from fedldp.cli_errors import EXIT_REFUSED, missing_extra

        message = missing_extra(exc, "the fedldp command line")
        if message is None:
            raise
        sys.stderr.write(f"Error: {message}\n")
        sys.exit(EXIT_REFUSED)
    cli()


if __name__ == "__main__":
    main()
