"""The `fedldp` command line: one click group, with each role's commands attached.

Each role keeps its commands in its own module and registers them below with one
line. Commands import their heavy dependencies lazily, inside the command body,
so `fedldp --help` stays fast and works with only the `cli` extra installed.
"""

from __future__ import annotations

import importlib

import click

# (module, attribute) of each command or group attached to the root group.
# Add ONE line per command group; keep the list sorted by command name.
COMMANDS: list[tuple[str, str]] = [
    ("fedldp.cli_train", "audit"),
    ("fedldp.cli_client", "client"),
    ("fedldp.cli_collector", "collector"),
    ("fedldp.cli_dashboard", "dashboard"),
    ("fedldp.demo", "demo"),
    ("fedldp.cli_keys", "keys"),
    ("fedldp.cli_collector", "ledger"),
    ("fedldp.cli_policy", "policy"),
    ("fedldp.cli_report", "release"),
    ("fedldp.cli_report", "report"),
    ("fedldp.cli_train", "train"),
    ("fedldp.cli_train", "verify"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fedldp")
def main() -> None:
    """fedldp: statistics from devices under local differential privacy."""


def _attach_commands() -> None:
    for module_name, attribute in COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or "a dependency"
            if missing.startswith("fedldp"):
                raise

            # A role whose extra is not installed: say what to install, do not crash.
            @click.command(name=attribute.replace("_", "-"))
            def _missing(missing: str = missing, module_name: str = module_name) -> None:
                raise click.ClickException(
                    f"{module_name} needs {missing!r}; install the matching extra, "
                    "e.g. pip install 'fedldp[all]'"
                )

            main.add_command(_missing)
            continue
        main.add_command(getattr(module, attribute))


_attach_commands()

if __name__ == "__main__":
    main()
