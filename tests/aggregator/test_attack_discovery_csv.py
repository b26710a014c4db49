"""ATTACK (audit atk2): discovered strings reach the CSV export unneutralized.

With `pem`, report labels are no longer the policy author's: they are strings
users recorded (aggregator/discovery.py; the terminal table already treats them
as hostile, see test_discovery.py::test_a_discovered_string_cannot_drive_the_analysts_terminal).
Any device may record a valid open-domain value such as "=1+2" or
"@SUM(1)"; once enough devices do, discovery reports it and
`FrequencyReport.to_csv` (`fedldp report --format csv`) writes it as a bare
cell, which a spreadsheet evaluates as a formula (CSV/formula injection,
CWE-1236; OWASP: prefix such cells with a quote). Fixed seed.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import numpy as np
from fedldp.aggregator.discovery import discovery_report
from fedldp.client.mechanisms import OpenDomain
from fedldp.client.mechanisms.pem import PEM

FORMULAS = ["=1+2", "@SUM", "+1-1"]
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def report_csv() -> str:
    mech = PEM(Decimal(8), OpenDomain(4))
    rng = np.random.default_rng(11)
    words = [*FORMULAS, "okay"]
    values = [words[i % len(words)] for i in range(6_000)]
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
    return discovery_report(mech, stat).to_csv()


def test_the_formula_strings_are_discovered() -> None:
    rows = list(csv.DictReader(io.StringIO(report_csv())))
    labels = {row["label"].lstrip("'") for row in rows}
    assert set(FORMULAS) <= labels


def test_no_discovered_label_cell_starts_a_formula() -> None:
    rows = list(csv.DictReader(io.StringIO(report_csv())))
    assert rows
    assert not [row["label"] for row in rows if row["label"].startswith(FORMULA_START)]
