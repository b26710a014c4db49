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
