"""`fedldp report --batch` and the dashboard's /shuffle page (docs/shuffle.md).

* the table, JSON and HTML outputs state ε0 (local, per report), the amplified central
  (ε, δ) per report over the n valid reports and the per-device guarantee beside the
  estimates, and the estimates equal, value for value, those of `fedldp report` on the same
  randomized outputs stored unsealed in a ledger;
* n is capped by the collector count of the manifest the shuffler wrote beside the batch
  (or --collector-count, which wins); a manifest that is not the file's is refused;
* ledger-only options with --batch, or --batch without the key, are usage errors;
* the dashboard, given the folder of the analyzer's JSON reports, serves them on /shuffle
  and /api/shuffle with the same guarantees, and lists a file that is no such report as
  skipped (never as a result).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from fedldp.aggregator.shuffle_analyzer import generate_analyzer_key
from fedldp.aggregator.shuffle_manifest import manifest_path, write_manifest
from fedldp.aggregator.shuffler import ShuffleSpool, release
from fedldp.client.mechanisms.base import CategoryOutput
from fedldp.client.sealed import seal_info, seal_output

from fedldp.cli import main
from tests.aggregator.test_attack_shuffle import _shuffle_policy_dirs

N = 120


@dataclass(frozen=True)
class Batch:
    """A released batch of N sealed GRR outputs with its manifest, and the folders."""

    base: Path
    file: Path
    trust: Path
    policies: Path
    policy: Any
    outputs: list[int]

    def args(self, *extra: str) -> list[str]:
        return [
            "report", "--batch", str(self.file), "--analyzer-key",
            str(self.base / "analyzer.key"), "--policy", self.policy.policy_id,
            "--policies", str(self.policies), "--trust", str(self.trust), *extra,
        ]  # fmt: skip


@pytest.fixture
def batch(tmp_path: Path, authority: Any) -> Batch:
    _, public = generate_analyzer_key(tmp_path)
    trust, policies, policy = _shuffle_policy_dirs(tmp_path, authority, public, min_batch=10)
    rng = np.random.default_rng(8)
    outputs = [int(o) for o in policy.mechanism.perturb_batch(rng.integers(0, 4, size=N), rng)]
    info = seal_info(policy.policy_id, policy.version, policy.digest)
    key = f"{policy.policy_id}.v{policy.version}.86400"
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    sealed = [seal_output(CategoryOutput(o), public, info=info).ciphertext for o in outputs]
    spool.add(key, sealed, ledger_count=N - 20)  # the ledger held fewer: the count caps n
    (tmp_path / "out").mkdir()
    path = release(spool, key, tmp_path / "out", min_batch=1)
    write_manifest(spool, key, path)
    return Batch(tmp_path, path, trust, policies, policy, outputs)


def _plain_json(batch: Batch, ledger_factory: Any, submit: Any) -> dict[str, Any]:
    """`fedldp report --format json` of the same outputs, unsealed, in a ledger (the policy
    without its [shuffle] section is a plain one: same mechanism, labels, ε)."""
    from fedldp.aggregator.reports import report_from_ledgers

    plain = _without_shuffle(batch.policy)
    ledger = ledger_factory("plain")
    submit(ledger, plain, [CategoryOutput(o) for o in batch.outputs])
    return report_from_ledgers([("ledger", ledger)], plain).to_dict()


def _without_shuffle(policy: Any) -> Any:
    import dataclasses

    message = type(policy.message)()
    message.CopyFrom(policy.message)
    message.ClearField("shuffle")
    return dataclasses.replace(policy, message=message)


def test_table_json_and_html_show_both_guarantees_beside_the_estimates(
    batch: Batch, ledger_factory: Any, submit: Any
) -> None:
    """Three formats; the estimates equal the unsealed reports'; n capped by the manifest."""
    runner = CliRunner()
    table = runner.invoke(main, batch.args())
    assert table.exit_code == 0, table.output
    assert "local: eps0 = 1 per report" in table.output
    assert "central (shuffled): (eps, delta) = (" in table.output
    assert f"per report over n = {N - 20}" in table.output
    assert "collector count 100 (from the shuffler's manifest)" in table.output
    assert "per device (at most 3 reports in the batch, group privacy): local eps = 3" in (
        table.output
    )
    assert "label" in table.output and "std err" in table.output  # the estimates' table
    data = json.loads(runner.invoke(main, batch.args("--format", "json")).output)
    shuffle = data["context"]["shuffle"]
    assert (shuffle["epsilon0"], shuffle["n"], shuffle["valid_reports"]) == ("1", N - 20, N)
    assert shuffle["collector_count_source"] == "manifest"
    assert 0 < float(shuffle["central_epsilon"]) < 1 < float(shuffle["device_epsilon"])
    plain = _plain_json(batch, ledger_factory, submit)
    assert [e["raw_estimate"] for e in data["estimates"]] == [
        e["raw_estimate"] for e in plain["estimates"]
    ]
    assert [e["std_error"] for e in data["estimates"]] == [
        e["std_error"] for e in plain["estimates"]
    ]
    assert "shuffle" not in plain["context"]
    page = batch.base / "report.html"
    html = runner.invoke(main, batch.args("--format", "html", "--out", str(page)))
    assert html.exit_code == 0, html.output
    text = page.read_text(encoding="utf-8")
    assert "Shuffle model: local and central guarantee" in text
    assert "local: ε0 = 1 per report" in text and "central (shuffled): (ε, δ) = (" in text
    assert text.index("Shuffle model") < text.index("<h2>Estimates</h2>")


def test_collector_count_option_wins_and_a_foreign_manifest_is_refused(batch: Batch) -> None:
    """--collector-count 50 caps n at 50; a manifest whose SHA-256 is not the file's: exit 1."""
    runner = CliRunner()
    capped = json.loads(
        runner.invoke(main, batch.args("--format", "json", "--collector-count", "50")).output
    )
    assert capped["context"]["shuffle"]["n"] == 50
    assert capped["context"]["shuffle"]["collector_count_source"] == "--collector-count"
    manifest = manifest_path(batch.file)
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "sha256": "0" * 64}))
    refused = runner.invoke(main, batch.args())
    assert refused.exit_code == 1 and "describes another file" in refused.output, refused.output
    manifest.write_text(json.dumps({**doc, "collector_count": 5}))
    below = runner.invoke(main, batch.args())
    assert below.exit_code == 1 and "fewer than the policy's signed shuffle min_batch 10" in (
        below.output
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--ledger", "sqlite:////nowhere.db"], "drop --ledger"),
        (["--window", "86400"], "drop --window"),
    ],
)
def test_ledger_options_with_batch_are_usage_errors(
    batch: Batch, extra: list[str], says: str
) -> None:
    result = CliRunner().invoke(main, batch.args(*extra))
    assert result.exit_code == 2 and says in result.output, result.output


def test_batch_without_the_key_and_count_without_batch_are_usage_errors(batch: Batch) -> None:
    args = batch.args()
    without_key = args[:3] + args[5:]
    result = CliRunner().invoke(main, without_key)
    assert result.exit_code == 2 and "--batch and --analyzer-key go together" in result.output
    plain = CliRunner().invoke(
        main, ["report", "--policy", "x", "--ledger", "sqlite:////x.db", "--collector-count", "3"]
    )
    assert plain.exit_code == 2 and "apply to --batch only" in plain.output


def test_the_dashboard_shows_the_analyzers_reports(batch: Batch) -> None:
    """/shuffle and /api/shuffle over a folder with one report and one file that is none."""
    from fedldp.aggregator.dashboard.app import DashboardServer
    from fedldp.collector.ledger import open_ledger

    from fedldp.cli_dashboard import load_dashboard
    from tests.dashboard.test_dashboard import get

    folder = batch.base / "reports"
    folder.mkdir()
    written = CliRunner().invoke(
        main, batch.args("--format", "json", "--out", str(folder / "atk.json"))
    )
    assert written.exit_code == 0, written.output
    (folder / "notes.json").write_text('{"kind": "frequency", "context": {}}', encoding="utf-8")
    url = f"sqlite:///{batch.base / 'ledger.db'}"
    open_ledger(url).close()
    dash = load_dashboard(url, batch.policies, batch.trust, None, shuffle_reports=folder)
    server = DashboardServer(dash, host="127.0.0.1", port=0, token=None).start()
    try:
        status, _, page = get(f"{server.url}shuffle")
        api_status, _, api = get(f"{server.url}api/shuffle")
        _, _, index = get(server.url)
    finally:
        server.stop()
    assert status == 200 and api_status == 200
    assert "local: ε0 = 1 per report" in page and "central (shuffled): (ε, δ) = (" in page
    assert f"over n = {N - 20}" in page and "class='estimates'" in page
    assert "notes.json: not a report on a shuffled batch" in page
    doc = json.loads(api)
    assert [r["file"] for r in doc["reports"]] == ["atk.json"]
    assert doc["reports"][0]["report"]["context"]["shuffle"]["n"] == N - 20
    assert doc["skipped"] == [
        {"file": "notes.json", "reason": "not a report on a shuffled batch (no context.shuffle)"}
    ]
    assert 'href="/shuffle"' in index  # the navigation
    assert 'class="shuffled" href="/shuffle">shuffle model' in index  # the policy's row


#: Edits of a manifest's JSON document and what read_manifest then says.
MANIFEST_EDITS: list[tuple[Any, str]] = [
    (lambda doc: "{not json", "is not a JSON manifest"),
    (lambda doc: json.dumps({**doc, "schema": "other/v1"}), "manifest"),
    (lambda doc: json.dumps({**doc, "collector_count": -1}), "wrong type"),
    (lambda doc: json.dumps({**doc, "collector_count": "120"}), "wrong type"),
    (lambda doc: json.dumps({**doc, "count": N + 1}), "another batch or count"),
    (lambda doc: json.dumps({**doc, "batch": "another.v1.0"}), "another batch or count"),
]


def test_a_manifest_that_is_not_the_files_is_refused(batch: Batch) -> None:
    """read_manifest refuses every malformed or foreign manifest with ValueError; the control
    (the manifest as written) reads back with the spool's counts."""
    from fedldp.aggregator.shuffle_manifest import read_manifest

    path = manifest_path(batch.file)
    written = path.read_text(encoding="utf-8")
    control = read_manifest(batch.file)
    assert control is not None and (control.count, control.collector_count) == (N, N - 20)
    for edit, says in MANIFEST_EDITS:
        path.write_text(edit(json.loads(written)), encoding="utf-8")
        with pytest.raises(ValueError, match=says):
            read_manifest(batch.file)


def test_the_shuffle_page_renders_numeric_reports_and_escapes_what_it_shows() -> None:
    """A numeric report shows its mean; a label or file name holding markup is escaped (the
    folder's files are the analyzer's, but the page trusts no text in them)."""
    from fedldp.aggregator.dashboard.shuffled import ShuffledReport, shuffle_body

    shuffle = {
        "batch": "b.v1.0", "valid_reports": 50, "invalid": {}, "epsilon0": "1",
        "local_epsilon_per_device": "1", "max_reports_per_device": 1, "collector_count": 50,
        "collector_count_source": "manifest", "n": 50, "delta": "1e-08",
        "central_epsilon": "0.9", "bound": "FMT21", "device_epsilon": "0.9",
        "device_delta": "1.01e-8",
    }  # fmt: skip
    context = {"policy_id": "b", "policy_version": 1, "window_start": 0, "shuffle": shuffle}
    numeric = {"kind": "numeric", "confidence": 0.95, "mean": 0.25, "std_error": 0.01,
               "ci_low": 0.23, "ci_high": 0.27, "context": context}  # fmt: skip
    estimate = {"label": "<b>x</b>", "estimate": 0.5, "std_error": 0.1, "ci_low": 0.3,
                "ci_high": 0.7}  # fmt: skip
    frequency = {"kind": "frequency", "confidence": 0.9, "estimates": [estimate],
                 "context": context}  # fmt: skip
    page = shuffle_body(
        Path("/reports"),
        [ShuffledReport("n.json", numeric), ShuffledReport("<i>f</i>.json", frequency)],
        [],
    )
    assert "mean 0.25 ± 0.01 (s.e.), 95% CI [0.23, 0.27]" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x" not in page
    assert "&lt;i&gt;f&lt;/i&gt;.json" in page and "<i>f" not in page
    assert "central (shuffled): (ε, δ) = (0.9, 1e-08) per report over n = 50" in page


def test_the_batch_keys_version_is_the_default(batch: Batch, authority: Any) -> None:
    """With v2 of the policy in the folder, a v1 batch is reported under v1 (it opens only
    there) unless --version says otherwise (then every payload fails to open: refused)."""
    from fedldp.authoring import write_envelope
    from fedldp.client.policy import verify_policy

    from tests.aggregator.conftest import NOW, WINDOW

    v2 = authority.categorical_policy(
        labels=["a", "b", "c", "d"], policy_id="atk", metric="metric.atk", epsilon="1",
        epsilon_cap="3", window_seconds=WINDOW, now=NOW - 60, version=2, min_reports=1,
    )  # fmt: skip
    v2.shuffle.CopyFrom(batch.policy.message.shuffle)
    envelope = authority.sign(v2)
    verify_policy(envelope, authority.trust_store(now=NOW), now=NOW)
    write_envelope(envelope, batch.policies / "p2.policy")
    runner = CliRunner()
    default = runner.invoke(main, batch.args("--format", "json"))
    assert default.exit_code == 0, default.output
    assert json.loads(default.output)["context"]["policy_version"] == 1
    forced = runner.invoke(main, batch.args("--version", "2"))
    assert forced.exit_code == 1 and "not estimated" in forced.output, forced.output


def test_a_plain_policy_is_refused(batch: Batch, make_policy: Any) -> None:
    """--batch under a policy without a [shuffle] section: exit 1, one line, nothing written."""
    from fedldp.authoring import write_envelope

    write_envelope(make_policy("plain").envelope, batch.policies / "plain.policy")
    out = str(batch.base / "r.json")  # a repeated --policy: click takes the last one
    args = batch.args("--policy", "plain", "--format", "json", "--out", out)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "has no [shuffle] section" in result.output, result.output
    assert not (batch.base / "r.json").exists()
