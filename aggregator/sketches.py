"""Analyst reports for sketch policies (CMS, HCMS): frequencies of candidate strings.

An open-domain metric has no list of values, so a report estimates the strings
the analyst names (`candidates`): for each, the mechanism's unbiased estimate and
its plug-in variance, which includes the sketch's collision term
(`fedldp.client.mechanisms.sketch`, `Sketch.estimate_candidates`). The result is
a `FrequencyReport` whose labels are the candidates, so every renderer (table,
JSON, CSV, HTML) and `heavy_hitters` apply unchanged; intervals are Wald
intervals at the given confidence, Bonferroni over the candidates with
`simultaneous`. Consistency post-processing is refused: it assumes the labels
cover the whole domain, which candidates never do.

Candidate files (`read_candidates`, `fedldp report --candidates FILE`) are UTF-8
text, one string per line; the line terminator (LF or CRLF) is not part of the
string, nothing else is stripped, and empty lines are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedldp.aggregator.consistency import Consistency
from fedldp.aggregator.estimation import (
    FrequencyReport,
    ReportContext,
    frequency_report_from_estimate,
)
from fedldp.client.mechanisms.sketch import MAX_CANDIDATES, Sketch

if TYPE_CHECKING:
    from fedldp.client.mechanisms.sketch import SketchStatistic


#: Why consistency post-processing is refused for candidates.
CONSISTENCY_NEEDS_DOMAIN = (
    "consistency post-processing needs a complete domain; a sketch's candidates are not "
    "one (use --consistency none)"
)


class CandidateFileError(ValueError):
    """A candidates file that cannot be read; the message names the file and line."""


def read_candidates(path: str | Path) -> list[str]:
    """The candidate strings of a file: UTF-8, one per line, empty lines skipped.

    Raises CandidateFileError for a file that is not UTF-8, has no candidate, or
    has more than MAX_CANDIDATES (the strings themselves are checked by the
    mechanism against the policy's open domain, `Sketch.candidate_cells`).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CandidateFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise CandidateFileError(f"{path}: cannot read ({exc.strerror})") from None
    candidates = [line.removesuffix("\r") for line in text.split("\n")]
    candidates = [c for c in candidates if c]
    if not candidates:
        raise CandidateFileError(f"{path}: no candidate strings (one per line)")
    if len(candidates) > MAX_CANDIDATES:
        raise CandidateFileError(
            f"{path}: {len(candidates)} candidates, more than {MAX_CANDIDATES}; split the file"
        )
    return candidates


def candidate_report(
    mechanism: Sketch,
    statistic: SketchStatistic,
    candidates: Sequence[str],
    *,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    context: ReportContext | None = None,
) -> FrequencyReport:
    """The estimated frequency of each candidate with intervals (module docstring).

    ValueError for consistency other than none, and for a candidate that is not a
    string of the policy's open domain or is given twice (by position).
    """
    if Consistency.parse(consistency) is not Consistency.NONE:
        raise ValueError(CONSISTENCY_NEEDS_DOMAIN)
    estimate = mechanism.estimate_candidates(statistic, candidates)
    return frequency_report_from_estimate(
        estimate,
        list(candidates),
        mechanism_id=mechanism.wire_id,
        epsilon=mechanism.epsilon,
        confidence=confidence,
        simultaneous=simultaneous,
        context=context,
    )


__all__ = ["CONSISTENCY_NEEDS_DOMAIN", "CandidateFileError", "candidate_report", "read_candidates"]
