"""Messages that name the file or option and the fix (issue 29, item 8)."""

from __future__ import annotations

from pathlib import Path

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
    with pytest.raises(ReceiptError, match=r"photo\.png is not a receipt: not UTF-8 text"):
        load_receipt(image)


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
