"""One wording for a file that was expected to be text and is not (issue 29, item 8).

`'utf-8' codec can't decode byte 0x89 in position 0` names neither the file nor what to
do; every reader of a text file (configuration, catalog, release policy, CSV data,
receipts, statistics exports) says `PATH is not UTF-8 text (byte 0x89)` and then its
own fix, through `not_text`. The byte shown is the first one that cannot be decoded
(a file's magic number, usually: 0x89 is PNG's, 0x50 0x4b a zip's): it tells the
operator which file they passed, and is never a value of a user's data row beyond the
one byte that failed to decode at all.
"""

from __future__ import annotations

from pathlib import Path


def not_text(path: Path | str, exc: UnicodeDecodeError) -> str:
    """`PATH is not UTF-8 text (byte 0xNN)`: the start of a message; callers add the fix."""
    return f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x})"


def read_utf8(path: Path | str, fix: str, error: type[Exception]) -> str:
    """The text of `path`; `error("PATH is not UTF-8 text (byte 0xNN); FIX")` when it is
    not UTF-8 (OSError propagates unchanged: each caller words its own)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{not_text(path, exc)}; {fix}") from None
