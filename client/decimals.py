"""The one parser of exact decimals typed by people or written in files.

The rule is the wire contract's (proto/fedldp/v1/policy.proto, rule 6): exact
quantities (epsilon, delta, caps, bounds) are decimal strings in plain notation:
digits, optionally a '.' and more digits, no exponent ("1e-5" is refused: write
"0.00001"), no "inf"/"nan", no blanks, no superfluous leading zero, at most
`MAX_CHARS` characters; a '-' only where a negative value makes sense (numeric
bounds). Every entry point uses it: policy authoring and verification, CLI
options, the training config, the demo. Values the code itself stored (ledger
rows) are read back with `Decimal` directly: `str(Decimal)` may use an exponent.
"""

from __future__ import annotations

import re
from decimal import Decimal

#: Longest accepted text, in characters (bounds what a verifier parses).
MAX_CHARS = 40

_PLAIN = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?")
_SIGNED_PLAIN = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


class DecimalSyntaxError(ValueError):
    """Text that is not a plain-notation decimal (the message names the field)."""


def parse_decimal(text: object, *, allow_negative: bool = False, name: str = "") -> Decimal:
    """The exact Decimal written as `text` in plain notation ("0.5", never "5e-1").

    `name` (an option or field, e.g. "--epsilon") starts the error message.
    Raises DecimalSyntaxError saying what is accepted.
    """
    pattern = _SIGNED_PLAIN if allow_negative else _PLAIN
    if not isinstance(text, str) or len(text) > MAX_CHARS or not pattern.fullmatch(text):
        sign = "an optional '-', " if allow_negative else ""
        example = (
            '"0.00001" not "1e-5"' if isinstance(text, str) and "e" in text.lower() else ('"0.5"')
        )
        raise DecimalSyntaxError(
            f"{name + ' ' if name else ''}must be a decimal in plain notation ({sign}digits, "
            f"optional '.digits', at most {MAX_CHARS} characters, e.g. {example}), got {text!r}"
        )
    return Decimal(text)
