"""The `fedldp` command line: one click group, with each role's commands attached.

Each role keeps its commands in its own module and registers them below with one
line. Commands import their heavy dependencies lazily, inside the command body,
so `fedldp --help` stays fast and works with only the `cli` extra installed.
"""

from __future__ import annotations

import importlib

import click

from fedldp.cli_errors import describe

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
    ("fedldp.cli_release_service", "release_service"),
    ("fedldp.cli_report", "report"),
    ("fedldp.cli_shuffle", "shuffler"),
    ("fedldp.cli_train", "train"),
    ("fedldp.cli_train", "verify"),
]


class FedldpGroup(click.Group):
    """The root group: runs every command through the error table (fedldp/cli_errors.py).

    An expected failure prints one line, ``Error: ...``, on stderr and exits with the
    table's code (1 refused, 2 usage); anything else is a bug: exit 70 with a pointer
    to ``--debug``, which re-raises so Python prints the traceback.
    """

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; map an unexpected exception to exit 70 (see the class)."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            failure = describe(exc)
            click.echo(f"Error: {failure.message}", err=True)
            ctx.exit(failure.exit_code)


DEBUG_KEY = "fedldp.debug"


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[DEBUG_KEY] = value
    return value


@click.group(cls=FedldpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fedldp", help="Print the version and exit.")
@click.option(
    "--debug",
    is_flag=True,
    envvar="FEDLDP_DEBUG",
    expose_value=False,
    is_eager=True,
    callback=_set_debug,
    help="On an unexpected error print the Python traceback (also FEDLDP_DEBUG=1).",
)
def main() -> None:
    """fedldp: statistics from devices under local differential privacy.

    \b
    Exit status: 0 done; 1 refused (config, file, ledger, network, policy,
    budget: the message says what to do); 2 usage (a malformed command line or
    value); 70 internal error (rerun with --debug for the traceback).
    """


def _missing_extra_command(name: str, error: ModuleNotFoundError) -> click.Command:
    """A stand-in for command `name` whose module needs an extra that is not installed:
    whatever its arguments, it says which extra to install (exit 1)."""
    message = describe(error).message

    @click.command(
        name=name,
        help=f"(not installed) {message}",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def _missing() -> None:
        raise click.ClickException(message)

    return _missing


def _attach_commands() -> None:
    """Attach every command of COMMANDS (a stand-in where its module's extra is missing)."""
    for module_name, attribute in COMMANDS:
        name = attribute.replace("_", "-")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("fedldp"):
                raise
            main.add_command(_missing_extra_command(name, exc))
            continue
        main.add_command(getattr(module, attribute))


_attach_commands()

if __name__ == "__main__":
    main()
