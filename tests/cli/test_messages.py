"""Messages that name the file or option and the fix (issue 29, item 8)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click
import pytest
from click.testing import CliRunner
from fedldp.aggregator.training.data import DataError, _read_csv
from fedldp.aggregator.training.receipt import ReceiptError, load_receipt
from fedldp.collector.ledger.model import ReservationNotFoundError

from fedldp.cli import main
from fedldp.cli_errors import describe
from fedldp.cli_report import _DataFile

#: The first bytes of a PNG file: what a mistyped --data often is.
NOT_TEXT = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "photo.png"
    path.write_bytes(NOT_TEXT)
    return path


def test_release_data_that_is_not_text_names_the_file(image: Path) -> None:
    with pytest.raises(click.ClickException) as caught:
        list(_DataFile(str(image), None)())
    assert f"--data {image} is not UTF-8 text (byte 0x89)" in caught.value.message


def test_training_csv_that_is_not_text_names_the_file(image: Path) -> None:
    with pytest.raises(DataError, match=r"photo\.png is not UTF-8 text \(byte 0x89\)"):
        _read_csv(image)


def test_a_receipt_that_is_not_text_names_the_file(image: Path) -> None:
    with pytest.raises(
        ReceiptError, match=r"photo\.png is not UTF-8 text \(byte 0x89\), so not a receipt: give"
    ):
        load_receipt(image)


def _read_train_toml(path: Path) -> object:
    from fedldp.aggregator.training.config import load_config

    return load_config(path)


def _read_collector_toml(path: Path) -> object:
    from fedldp.collector.config import load_config

    return load_config(path)


def _read_catalog(path: Path) -> object:
    from fedldp.aggregator.service.catalog import load_catalog

    return load_catalog(path)


def _read_release_policy(path: Path) -> object:
    from fedldp.aggregator.service.policy import policy_payload

    return policy_payload(path)


def _read_statistics_export(path: Path) -> object:
    """`report --merge FILE` (the file is read before the policy is looked at)."""
    from fedldp.aggregator.reports import load_export

    return load_export(path, cast(Any, None))


def _read_shuffler_toml(path: Path) -> object:
    from fedldp.aggregator.shuffler_config import load

    return load(path)


@pytest.mark.parametrize(
    ("read", "fix"),
    [
        (_read_train_toml, "; a train.toml is a UTF-8 TOML file: check --config"),
        (_read_collector_toml, "; a collector.toml is a UTF-8 TOML file: check --config"),
        (_read_catalog, "; a catalog is a UTF-8 TOML file"),
        (_read_release_policy, "; a release policy is a UTF-8 TOML file"),
        (_read_statistics_export, ", so not a statistics export: give the JSON that `fedldp"),
        (_read_shuffler_toml, "; shuffler.toml is a UTF-8 TOML file: check --config"),
    ],
)
def test_a_text_file_that_is_not_text_names_the_file_and_the_fix(
    read: Callable[[Path], object], fix: str, image: Path
) -> None:
    """Not `'utf-8' codec can't decode byte 0x89 in position 0`, nor the generic "a file
    is not UTF-8 text" (cli_errors' last resort), but which file and what it should be."""
    with pytest.raises(Exception) as caught:
        read(image)
    assert str(caught.value).startswith(f"{image} is not UTF-8 text (byte 0x89){fix}")
    assert "codec" not in str(caught.value)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["collector", "mint-token", "d", "--secret-file"], "--secret-file {} must hold hex"),
        (["train", "--config"], "{} is not UTF-8 text (byte 0x89); a train.toml"),
        (["collector", "serve", "--config"], "config: {} is not UTF-8 text (byte 0x89)"),
        (
            ["shuffler", "serve", "--config"],
            "shuffler config: {} is not UTF-8 text (byte 0x89); shuffler.toml is a UTF-8",
        ),
    ],
)
def test_a_binary_file_on_the_command_line_is_one_clear_line(
    args: list[str], says: str, image: Path
) -> None:
    result = CliRunner().invoke(main, [*args, str(image)])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"Error: {says.format(image)}"), result.stderr


def test_a_key_error_is_shown_as_its_text_not_its_repr() -> None:
    """`no reservation '999999'`, not `'no reservation \\'999999\\''`."""
    failure = describe(ReservationNotFoundError("no reservation '999999'"))
    assert failure.message == "ledger refused: no reservation '999999'"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "or --none (no central release was made since)"),
        (["--none", "--spent", "a", "p", "1", "0"], "not both"),
    ],
)
def test_confirm_central_says_what_is_missing(args: list[str], says: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    result = CliRunner().invoke(main, ["ledger", "confirm-central", "--ledger", url, *args])
    assert result.exit_code == 2 and says in result.stderr, result.output
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[groups]\nF = 1\n", '[groups] F must be a list of analyst names, e.g. F = ["alice"]'),
        ("groups = 3\n", "[groups] must be a table"),
        ("[datasets]\nd = 4\n", "[datasets.d] has a value of the wrong type"),
    ],
)
def test_a_catalog_value_of_the_wrong_type_names_its_section(
    text: str, says: str, tmp_path: Path
) -> None:
    from fedldp.aggregator.service.catalog import CatalogError, load_catalog

    path = tmp_path / "catalog.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert says in str(caught.value) and "is not iterable" not in str(caught.value).split("(")[0]


def test_train_on_a_closed_port_says_why(tmp_path: Path) -> None:
    """The driver's reason, not only "OperationalError"."""
    from fedldp.aggregator.training.config import load_config
    from fedldp.aggregator.training.errors import BudgetRefusedError
    from fedldp.aggregator.training.lifecycle import run_ledger

    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "train.toml"
    text = example.read_text(encoding="utf-8").replace(
        'ledger = "sqlite:////var/lib/fedldp/ledger.db"',
        'ledger = "postgresql+psycopg://u:pw@127.0.0.1:1/d?connect_timeout=2"',
    )
    (tmp_path / "train.toml").write_text(text, encoding="utf-8")
    with (
        pytest.raises(BudgetRefusedError) as caught,
        run_ledger(load_config(tmp_path / "train.toml"), None),
    ):
        pass
    message = str(caught.value)
    assert "([budget] ledger): OperationalError: " in message and "pw" not in message
    assert "check the URL and that the database server is reachable" in message


def test_shards_show_of_one_ledger_says_it_is_not_sharded(tmp_path: Path) -> None:
    """Its help allows one ledger_url: it says so (exit 0) and creates nothing."""
    config = tmp_path / "collector.toml"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config.write_text(f'[collector]\nledger_url = "{url}"\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["ledger", "shards", "show", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"1 ledger, not sharded: {url}")
    assert not (tmp_path / "ledger.db").exists()


def _future_ledger(tmp_path: Path) -> tuple[str, Path]:
    """A ledger a newer fedldp migrated (its revision unknown here)."""
    import sqlite3

    from fedldp.collector.ledger import open_ledger

    path = tmp_path / "ledger.db"
    open_ledger(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999_future'")
    return f"sqlite:///{path}", path


def test_migrate_of_a_newer_ledger_names_it_and_the_fix(tmp_path: Path) -> None:
    """Not `internal error (CommandError: Can't locate revision ...)`, exit 70."""
    import sqlite3

    url, path = _future_ledger(tmp_path)
    result = CliRunner().invoke(main, ["ledger", "migrate", "--ledger", url])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(
        f"Error: ledger: ledger {url} is at migration '9999_future', which this fedldp "
        "does not know"
    ), result.stderr
    assert "upgrade fedldp, nothing was changed" in result.stderr
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            ("9999_future",)
        ]


def test_a_collector_opening_a_newer_ledger_names_it(tmp_path: Path) -> None:
    """open_ledger (what `collector serve` and `ledger init` call) refuses it the same way."""
    from fedldp.collector.ledger import LedgerOpenError, open_ledger

    url, _ = _future_ledger(tmp_path)
    with pytest.raises(LedgerOpenError, match="is at migration '9999_future', which this"):
        open_ledger(url)


def test_a_token_secret_that_is_not_hex_names_the_option_and_the_fix(image: Path) -> None:
    """`release-service serve --token-secret-file` (before: `non-hexadecimal number found
    in fromhex() arg at position 0`, naming neither)."""
    from fedldp.collector.config import ConfigError

    from fedldp.cli_collector import secret_from_file

    with pytest.raises(ConfigError) as caught:
        secret_from_file(str(image), "--token-secret-file")
    assert str(caught.value) == (
        f"--token-secret-file {image} must hold hex digits (make one with "
        "`fedldp collector gen-secret`)"
    )


def test_a_dashboard_token_file_that_is_not_text_names_it(image: Path) -> None:
    from fedldp.cli_dashboard import _token

    with pytest.raises(click.ClickException) as caught:
        _token(str(image))
    assert caught.value.message.startswith(
        f"{image} is not UTF-8 text (byte 0x89); --token-file holds the bearer token"
    )
