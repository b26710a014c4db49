"""One vocabulary: every option of every command has help text; old spellings still work.

Walks the whole `fedldp` click tree (every group and command) and fails on an
option without help (hidden deprecated aliases excepted: they carry help anyway).
"""

from __future__ import annotations

from collections.abc import Iterator

import click
from click.testing import CliRunner

from fedldp.cli import main


def _commands(group: click.Group, path: str = "fedldp") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path} {name}")


def test_every_option_has_help() -> None:
    missing = [
        f"{path} {'/'.join(param.opts)}"
        for path, command in [("fedldp", main), *_commands(main)]
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_ledger_and_trust_are_spelled_the_same_everywhere() -> None:
    for path, command in _commands(main):
        names = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}
        assert "--trust-dir" not in names or "--trust" in names, path
        assert "--url" not in names or "--ledger" in names, path


def test_old_spelling_still_works_with_a_deprecation_line(tmp_path: object) -> None:
    result = CliRunner().invoke(
        main, ["ledger", "show", "x", "--url", "sqlite:////nonexistent/l.db"]
    )
    assert "--url is deprecated; use --ledger" in result.output
    assert "does not exist" in result.output and result.exit_code == 1


def test_times_are_typed_as_iso_8601_or_epoch() -> None:
    from fedldp.cli_common import TimeParam, iso_utc

    when = TimeParam()
    assert when.convert("2026-12-01T00:00:00Z", None, None) == 1_796_083_200
    assert when.convert("2026-12-01", None, None) == 1_796_083_200
    assert when.convert("2026-12-01T02:00:00+02:00", None, None) == 1_796_083_200
    assert when.convert("1796083200", None, None) == 1_796_083_200
    assert iso_utc(1_796_083_200) == "2026-12-01T00:00:00Z"
    try:
        when.convert("yesterday", None, None)
    except click.BadParameter as exc:
        assert "ISO 8601" in str(exc)
    else:
        raise AssertionError("'yesterday' was accepted")
