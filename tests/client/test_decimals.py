"""The one exact-decimal parser (policy.proto rule 6: plain notation, no exponent).

Property tests: every finite Decimal written in plain notation parses back to
itself exactly; every text with an exponent, a blank, a '+', "inf"/"nan", a
superfluous leading zero or a bare '.' is refused. A deliberately broken parser
(plain `Decimal(text)`) fails the refusal properties, so they are not vacuous.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation

import pytest
from fedldp.client.decimals import MAX_CHARS, DecimalSyntaxError, parse_decimal
from hypothesis import given
from hypothesis import strategies as st

Parser = Callable[..., Decimal]


def _plain(value: Decimal) -> str:
    """`value` in plain notation, as a person would type it (no trailing '.')."""
    text = format(value, "f")
    return "0" if text in ("-0", "0") else text


finite = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: len(_plain(d)) <= MAX_CHARS
)


@given(finite)
def test_plain_notation_round_trips_exactly(value: Decimal) -> None:
    text = _plain(value)
    if text.startswith("-"):
        with pytest.raises(DecimalSyntaxError):
            parse_decimal(text)
        assert parse_decimal(text, allow_negative=True) == value
    else:
        assert parse_decimal(text) == value


@given(
    st.decimals(min_value=Decimal("1e-30"), max_value=Decimal("1e30"), allow_nan=False),
    st.sampled_from(["e", "E"]),
)
def test_exponent_notation_is_refused(value: Decimal, e: str) -> None:
    text = f"{value:e}".replace("e", e)
    with pytest.raises(DecimalSyntaxError, match="plain notation"):
        parse_decimal(text, allow_negative=True)


BAD = ["1e-5", "1E3", "inf", "-inf", "nan", "Infinity", " 1", "1 ", "+1", "01", "1.", ".5",
       "", "1_0", "0x10", "1,5", "--1", "-", "١"]  # fmt: skip


def _broken(text: str, **_: object) -> Decimal:
    """The bug this parser replaced: Decimal() accepts exponents, blanks, "inf"."""
    return Decimal(text)


def _refuses_all(parser: Parser) -> bool:
    for text in BAD:
        try:
            parser(text, allow_negative=True)
        except (DecimalSyntaxError, InvalidOperation):
            continue
        return False
    return True


def test_refuses_every_other_spelling() -> None:
    assert _refuses_all(parse_decimal)
    assert not _refuses_all(_broken)  # the broken variant is caught


@given(st.text(max_size=50))
def test_any_text_parses_exactly_or_is_refused(text: str) -> None:
    try:
        value = parse_decimal(text, allow_negative=True)
    except DecimalSyntaxError as exc:
        assert "plain notation" in str(exc)
        return
    assert (value.is_finite() and _plain(value) == text) or text.endswith("0") or "." in text
    assert Decimal(text) == value


def test_message_names_the_option_and_suggests_the_plain_form() -> None:
    with pytest.raises(DecimalSyntaxError) as caught:
        parse_decimal("1e-5", name="--delta")
    assert str(caught.value).startswith("--delta must be")
    assert '"0.00001" not "1e-5"' in str(caught.value)
    with pytest.raises(DecimalSyntaxError):
        parse_decimal("1" * (MAX_CHARS + 1))
