"""The CLI error table (fedldp/cli_errors.py) and the root group that applies it."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from fedldp.client.decimals import DecimalSyntaxError

from fedldp.cli import FedldpGroup, _set_debug
from fedldp.cli_errors import EXIT_INTERNAL, EXIT_REFUSED, EXIT_USAGE, describe, mask_password


@click.group(cls=FedldpGroup)
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug)
def group() -> None:
    """A root group like `fedldp`'s."""


@group.command()
def boom() -> None:
    raise ZeroDivisionError("a bug")


@group.command()
def missing() -> None:
    Path("/nonexistent-fedldp-dir/file.toml").read_text(encoding="utf-8")


def test_a_bug_exits_70_with_a_pointer_to_debug_and_debug_shows_it() -> None:
    runner = CliRunner()
    result = runner.invoke(group, ["boom"])
    assert result.exit_code == EXIT_INTERNAL
    assert "Error: internal error (ZeroDivisionError: a bug)" in result.output
    assert "--debug" in result.output and "Traceback" not in result.output
    debug = runner.invoke(group, ["--debug", "boom"])
    assert isinstance(debug.exception, ZeroDivisionError)  # the traceback is Python's


def test_an_expected_failure_is_one_line_exit_1() -> None:
    result = CliRunner().invoke(group, ["missing"])
    assert result.exit_code == EXIT_REFUSED
    assert result.output == (
        "Error: /nonexistent-fedldp-dir/file.toml: no such file or folder; check the path\n"
    )


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        (DecimalSyntaxError("--epsilon must be ..."), EXIT_USAGE, "--epsilon must be"),
        (IsADirectoryError(21, "Is a directory", "/etc"), EXIT_REFUSED, "/etc: is a folder"),
        (sqlite3.DatabaseError("file is not a database"), EXIT_REFUSED, "not a fedldp ledger"),
        (RuntimeError("x"), EXIT_INTERNAL, "internal error"),
    ],
)
def test_table_entries(exc: BaseException, code: int, text: str) -> None:
    failure = describe(exc)
    assert failure.exit_code == code and text in failure.message


def test_toml_errors_and_passwords() -> None:
    toml = importlib.import_module("tomllib")  # Python 3.11+ (mypy targets 3.10)
    with pytest.raises(toml.TOMLDecodeError) as caught:
        toml.loads("[x")
    assert describe(caught.value).message.startswith("a TOML file is not valid TOML")
    assert mask_password("postgresql+psycopg://u:hunter2@db/x") == "postgresql+psycopg://u:***@db/x"
    assert "hunter2" not in describe(ValueError("postgresql://u:hunter2@h/d")).message


# Exception classes of the packages that never reach the command line, and why.
NOT_FROM_THE_CLI = {
    # The collector's gRPC status table (collector/errors.py) turns these into a
    # status for the device; they never leave a request handler.
    "fedldp.collector.errors.CollectorError": "gRPC status table",
    # Retried inside the ledger's transaction loop; never leave the ledger.
    "fedldp.collector.ledger.engine._ConcurrentUpdateError": "ledger retry loop",
    # A supervised collector process whose supervisor is gone: caught by daemon.serve.
    "fedldp.collector.daemon._SupervisorGoneError": "caught by daemon.serve (exit 0)",
    # A program that uses a closed SDK Client has a bug: exit 70 is right.
    "fedldp.client.results.ClientClosedError": "SDK misuse (a bug)",
    # `fedldp report` turns a bad --candidates file into its own one-line error.
    "fedldp.aggregator.sketches.CandidateFileError": "caught by fedldp report (_candidates)",
    # Reports estimate sketches with estimate_candidates; estimate() is API misuse.
    "fedldp.client.mechanisms.sketch.CandidatesRequiredError": "API misuse (a bug)",
}


def _package_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in fedldp's packages (fedldp, client, collector,
    aggregator), found by importing each module."""
    import inspect
    import pkgutil

    import fedldp.aggregator
    import fedldp.client
    import fedldp.collector

    import fedldp

    found: dict[str, type[BaseException]] = {}
    for package in (fedldp, fedldp.client, fedldp.collector, fedldp.aggregator):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(("fedldp.v1", "fedldp.collector.migrations")):
                continue
            try:
                module = importlib.import_module(info.name)
            except ModuleNotFoundError as exc:  # an extra that is not installed (torch)
                if (exc.name or "").startswith("fedldp"):
                    raise
                continue
            for obj in vars(module).values():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, Exception)
                    and obj.__module__ == module.__name__
                    and not issubclass(obj, click.ClickException)  # click prints these itself
                ):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return sorted(found.values(), key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_package_exception_is_in_the_table_or_never_reaches_the_cli() -> None:
    """A new exception class that a command can raise gets a row in the table (a one-line
    error with exit 1 or 2), or a line in NOT_FROM_THE_CLI saying why it cannot escape."""
    classes = _package_exceptions()
    assert len(classes) > 50  # the walk found the packages
    unmapped = []
    for cls in classes:
        names = {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__}
        if names & NOT_FROM_THE_CLI.keys():
            continue
        exc = cls.__new__(cls)  # no constructor arguments needed: the table reads the class
        if describe(exc).exit_code == EXIT_INTERNAL:
            unmapped.append(f"{cls.__module__}.{cls.__qualname__}")
    assert unmapped == []


def test_restore_incomplete_and_in_memory_ledgers_are_one_line_refusals() -> None:
    from fedldp.collector.ledger import LedgerOpenError, open_ledger
    from fedldp.collector.ledger.restore import RestoreIncompleteError

    incomplete = describe(RestoreIncompleteError("this database holds a restore ..."))
    assert incomplete.exit_code == EXIT_REFUSED and incomplete.message.startswith("ledger: ")
    with pytest.raises(LedgerOpenError, match="durable SQLite file") as caught:
        open_ledger("sqlite://")
    assert describe(caught.value).exit_code == EXIT_REFUSED
