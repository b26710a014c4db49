"""Every row of the CLI error table names a class by its own qualified name.

The table matches an exception's MRO by `module.qualname` (so `fedldp --help`
imports nothing heavy); a class moved to another module would silently stop
matching, and its errors would exit 70 as bugs. The broken variant (a ledger
error named by the module that re-exports it, not the one defining it) is kept
as a test.
"""

from __future__ import annotations

import importlib

import pytest

from fedldp.cli_errors import _TABLE, EXIT_REFUSED, describe


def own_name(qualified: str) -> str | None:
    """The defining `module.qualname` of the class `qualified` resolves to (None: none)."""
    parts = qualified.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        if not isinstance(obj, type):
            return None
        return f"{obj.__module__}.{obj.__qualname__}"
    return None


@pytest.mark.parametrize("name", [row[0] for row in _TABLE])
def test_each_row_names_its_class_where_it_is_defined(name: str) -> None:
    if name.startswith("tomli."):  # the TOML parser of Python < 3.11
        pytest.importorskip("tomli")
    assert own_name(name) == name


def test_ledger_errors_are_refusals_with_their_prefix() -> None:
    from fedldp.collector.ledger import LedgerError, LedgerOpenError

    opened = describe(LedgerOpenError("no ledger at /x"))
    assert opened.exit_code == EXIT_REFUSED and opened.message.startswith("ledger: ")
    refused = describe(LedgerError("cap"))
    assert refused.exit_code == EXIT_REFUSED and refused.message.startswith("ledger refused: ")


def test_broken_variant_a_re_exported_name_is_caught() -> None:
    assert own_name("fedldp.collector.ledger.store.LedgerOpenError") != (
        "fedldp.collector.ledger.store.LedgerOpenError"
    )
