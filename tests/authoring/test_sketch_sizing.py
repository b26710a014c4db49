"""`auto` sizing of a sketch at authoring (authoring/sizing.py, issue 33).

Exact checks on the mechanism's own variance formulas: the chosen (k, m) meets
the collision share, and no size with fewer counters does (a smaller k at the
same m, or any k at m/2 or 2m that would use fewer counters); where no size fits
in max_cells, the choice is the least collision share and says so. The broken
variant, sizing without the heavy strings' collision term (P_{-d}/k), picks a
sketch whose collisions exceed the target. `fedldp policy sign` writes the chosen
rows and columns into the signed policy and prints the size and why.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from fedldp.authoring.sizing import DEFAULT_MAX_CELLS, _variances, auto_size
from fedldp.client.mechanisms.base import OpenDomain
from fedldp.client.mechanisms.sketch import MAX_COLUMNS, MIN_COLUMNS

from fedldp.cli import main

DOMAIN = OpenDomain(32)
S = Decimal("0.03")
CASES = [("cms", "1", 10_000), ("cms", "2", 100_000), ("hcms", "2", 1_000_000)]


def _meets(wire_id: str, eps: str, k: int, m: int, n: int) -> bool:
    noise, collision = _variances(wire_id, Decimal(eps), DOMAIN, k, m, n, float(S))
    return collision <= 0.1 * noise


@pytest.mark.parametrize(("wire_id", "eps", "n"), CASES)
def test_the_auto_size_meets_the_target_with_the_fewest_counters(
    wire_id: str, eps: str, n: int
) -> None:
    size = auto_size(wire_id, Decimal(eps), DOMAIN, expected_reports=n, same_string=S)
    k, m = size.rows, size.columns
    assert size.met and size.collision_ratio <= 0.1 and k * m <= DEFAULT_MAX_CELLS
    assert _meets(wire_id, eps, k, m, n)
    assert k == 1 or not _meets(wire_id, eps, k - 1, m, n)
    if m // 2 >= MIN_COLUMNS:  # at m/2, only k' < 2k would use fewer counters
        assert not any(_meets(wire_id, eps, kk, m // 2, n) for kk in range(1, 2 * k))
    if 2 * m <= MAX_COLUMNS:  # at 2m, only k' < k/2
        assert not any(_meets(wire_id, eps, kk, 2 * m, n) for kk in range(1, (k + 1) // 2))


def test_sizing_without_the_heavy_strings_term_misses_the_target() -> None:
    """Broken variant: P_{-d} taken as 0 (only the n/m collisions)."""
    honest = auto_size("cms", Decimal(2), DOMAIN, expected_reports=100_000, same_string=S)
    broken = auto_size("cms", Decimal(2), DOMAIN, expected_reports=100_000, same_string=Decimal(0))
    assert honest.met and broken.rows * broken.columns < honest.rows * honest.columns
    assert not _meets("cms", "2", broken.rows, broken.columns, 100_000)


def test_an_unreachable_target_takes_the_least_collision_share_and_says_so() -> None:
    size = auto_size("cms", Decimal(8), DOMAIN, expected_reports=1_000_000, same_string=S)
    assert not size.met and size.rows * size.columns == DEFAULT_MAX_CELLS
    assert size.columns == MAX_COLUMNS  # the n/m term favours the widest rows
    assert "NOT met within max_cells" in "\n".join(size.explain("cms", Decimal(8)))
    with pytest.raises(ValueError, match="max_cells"):
        auto_size("cms", Decimal(8), DOMAIN, expected_reports=10, max_cells=1 << 21)


POLICY = """
policy_id = "app.search"
version = 1
purpose = "Which search terms are frequent."
audience = ["prod"]
not_before = 2026-12-01T00:00:00Z
expires_at = 2027-03-01T00:00:00Z
min_reports_for_release = 100

[metric]
name = "app.search"
max_bytes = 32

[mechanism]
id = "cms"
epsilon = "2"
{extra}

[budget]
epsilon_cap = "2"
window = "1d"
"""


def _sign(tmp_path: Path, extra: str) -> tuple[int, str, Path]:
    runner = CliRunner()
    assert (
        runner.invoke(main, ["keys", "generate", "--out", str(tmp_path), "--name", "p"]).exit_code
        == 0
    )
    source = tmp_path / "policy.toml"
    source.write_text(POLICY.format(extra=extra), encoding="utf-8")
    out = tmp_path / "signed.policy"
    args = ["policy", "sign", str(source), "--key", str(tmp_path / "p.key"), "--out", str(out)]
    result = runner.invoke(main, args)
    return result.exit_code, result.output, out


def test_policy_sign_states_the_auto_size_and_why(tmp_path: Path) -> None:
    code, output, out = _sign(
        tmp_path, '[mechanism.sizing]\nexpected_reports = 100000\nsame_string_probability = "0.03"'
    )
    assert code == 0, output
    size = auto_size("cms", Decimal(2), DOMAIN, expected_reports=100_000, same_string=S)
    assert f"rows k = {size.rows}, columns m = {size.columns}" in output
    assert "why: collisions add" in output
    shown = CliRunner().invoke(main, ["policy", "show", str(out)])
    assert f'"rows": "{size.rows}"' in shown.output
    assert f'"columns": "{size.columns}"' in shown.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[mechanism.params]\nrows = "4"\n[mechanism.sizing]\nexpected_reports = 10', "not both"),
        ('[mechanism.sizing]\nsame_string_probability = "0.1"', "needs expected_reports"),
        ("[mechanism.sizing]\nexpected_reports = 10\nbogus = 1", "unknown keys"),
        ("[mechanism.sizing]\nexpected_reports = 10\ncollision_share = 0.1", "decimal string"),
    ],
)
def test_bad_sizing_is_refused_with_nothing_written(
    tmp_path: Path, extra: str, message: str
) -> None:
    code, output, out = _sign(tmp_path, extra)
    assert code == 1 and message in output, output
    assert not out.exists()
