"""`fedldp keys` and `fedldp policy`: a round trip through the command line (CliRunner)."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fedldp.authoring import load_private_key
from fedldp.client.policy import read_envelope

from fedldp.cli_keys import keys
from fedldp.cli_policy import policy

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "deploy" / "policies" / "example-policy.toml"
# The example policy is valid from 2026-12-01T00:00:00Z for three months.
VALID_AT = "1796083300"


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def _sign(runner: CliRunner, key: Path, out: Path) -> str:
    """`fedldp policy sign` of the example policy with `key` into `out`; must succeed."""
    return _ok(runner.invoke(policy, ["sign", str(EXAMPLE), "--key", str(key), "--out", str(out)]))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _generate(runner: CliRunner, keys_dir: Path, name: str) -> None:
    """`fedldp keys generate` of key pair `name` (unencrypted) into `keys_dir`; must succeed."""
    _ok(runner.invoke(keys, ["generate", "--out", str(keys_dir), "--name", name]))


def _setup(runner: CliRunner, tmp_path: Path) -> Path:
    keys_dir = tmp_path / "keys"
    _generate(runner, keys_dir, "root")
    _generate(runner, keys_dir, "policy")
    _ok(
        runner.invoke(
            keys,
            [
                "init-root",
                "--root-key",
                str(keys_dir / "root.key"),
                "--policy-key",
                str(keys_dir / "policy.pub"),
                "--now",
                "1796000000",
                "--expires",
                "+365d",
                "--out",
                str(tmp_path / "1.root"),
            ],
        )
    )
    return keys_dir


def test_every_command_has_help(runner: CliRunner) -> None:
    for group, commands in (
        (keys, ["generate", "id", "init-root", "rotate"]),
        (policy, ["sign", "verify", "show"]),
    ):
        _ok(runner.invoke(group, ["--help"]))
        for command in commands:
            assert "Usage:" in _ok(runner.invoke(group, [command, "--help"]))


def test_commands_are_registered_in_the_root_cli() -> None:
    text = (REPO_ROOT / "fedldp" / "cli.py").read_text()
    assert '("fedldp.cli_keys", "keys")' in text
    assert '("fedldp.cli_policy", "policy")' in text


def test_generate_writes_a_0600_private_key(runner: CliRunner, tmp_path: Path) -> None:
    out = _ok(runner.invoke(keys, ["generate", "--out", str(tmp_path), "--name", "k"]))
    private = tmp_path / "k.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert (tmp_path / "k.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    key_id = out.split("key id:")[1].strip()
    assert _ok(runner.invoke(keys, ["id", str(tmp_path / "k.pub")])).strip() == key_id
    # Never overwrites.
    again = runner.invoke(keys, ["generate", "--out", str(tmp_path), "--name", "k"])
    assert again.exit_code != 0 and "exists" in again.output


def test_generate_with_a_passphrase(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDLDP_TEST_PASS", "correct horse")
    _ok(
        runner.invoke(
            keys,
            [
                "generate",
                "--out",
                str(tmp_path),
                "--name",
                "k",
                "--passphrase-env",
                "FEDLDP_TEST_PASS",
            ],
        )
    )
    private = tmp_path / "k.key"
    assert private.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    load_private_key(private, passphrase=b"correct horse")
    missing = runner.invoke(
        keys,
        ["generate", "--out", str(tmp_path), "--name", "x", "--passphrase-env", "FEDLDP_NOT_SET"],
    )
    assert missing.exit_code != 0 and "FEDLDP_NOT_SET" in missing.output


def test_sign_verify_show_round_trip(runner: CliRunner, tmp_path: Path) -> None:
    keys_dir = _setup(runner, tmp_path)
    envelope_path = tmp_path / "homepage.policy"
    out = _sign(runner, keys_dir / "policy.key", envelope_path)
    digest = out.split("digest:")[1].split()[0]
    key_id = out.split("key id:")[1].split()[0]

    verified = _ok(
        runner.invoke(
            policy,
            [
                "verify",
                str(envelope_path),
                "--root",
                str(tmp_path / "1.root"),
                "--pin",
                str(keys_dir / "root.pub"),
                "--now",
                VALID_AT,
                "--audience",
                "prod-eu",
            ],
        )
    )
    assert "OK: policy browser-homepage v3" in verified
    assert digest in verified and key_id in verified

    # The same through a trust folder.
    trust_dir = tmp_path / "trust"
    (trust_dir / "pinned").mkdir(parents=True)
    shutil.copy(keys_dir / "root.pub", trust_dir / "pinned" / "root.pub")
    shutil.copy(tmp_path / "1.root", trust_dir / "1.root")
    _ok(
        runner.invoke(
            policy, ["verify", str(envelope_path), "--trust-dir", str(trust_dir), "--now", VALID_AT]
        )
    )

    shown = json.loads(_ok(runner.invoke(policy, ["show", str(envelope_path)])))
    assert shown["verified"] is False
    assert shown["digest"] == digest
    assert shown["signatures"][0]["key_id"] == key_id
    assert shown["decoded"]["policy_id"] == "browser-homepage"
    assert shown["decoded"]["mechanism"]["epsilon"] == "1.0"
    root_shown = json.loads(_ok(runner.invoke(policy, ["show", str(tmp_path / "1.root")])))
    assert root_shown["decoded"]["version"] == "1"


def test_verify_refusals_exit_1_with_the_reason(runner: CliRunner, tmp_path: Path) -> None:
    keys_dir = _setup(runner, tmp_path)
    envelope_path = tmp_path / "p.policy"
    _sign(runner, keys_dir / "policy.key", envelope_path)
    base = [
        "verify",
        str(envelope_path),
        "--root",
        str(tmp_path / "1.root"),
        "--pin",
        str(keys_dir / "root.pub"),
    ]
    cases = {
        "ExpiredPolicyError": ["--now", "1803859200"],
        "NotYetValidPolicyError": ["--now", "1796000000"],
        "AudienceMismatchError": ["--now", VALID_AT, "--audience", "prod-us"],
        "EpsilonAboveMaximumError": ["--now", VALID_AT, "--max-epsilon", "0.5"],
        "RollbackError": ["--now", VALID_AT, "--highest-version", "4"],
    }
    for name, extra in cases.items():
        result = runner.invoke(policy, base + extra)
        assert result.exit_code == 1, (name, result.output)
        assert f"REFUSED ({name})" in result.output


def test_sign_lists_every_problem_and_writes_nothing(runner: CliRunner, tmp_path: Path) -> None:
    keys_dir = _setup(runner, tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(
        EXAMPLE.read_text()
        .replace('epsilon = "1.0"', "epsilon = 1.0")
        .replace('"news", "search"', '"news", "news"')
    )
    out_path = tmp_path / "bad.policy"
    result = runner.invoke(
        policy, ["sign", str(bad), "--key", str(keys_dir / "policy.key"), "--out", str(out_path)]
    )
    assert result.exit_code != 0
    assert "TOML float" in result.output and "unique" in result.output
    assert not out_path.exists()


def test_rotate_adds_a_policy_key_and_retires_the_old_one(
    runner: CliRunner, tmp_path: Path
) -> None:
    keys_dir = _setup(runner, tmp_path)
    _generate(runner, keys_dir, "root2")
    _generate(runner, keys_dir, "policy2")
    _ok(
        runner.invoke(
            keys,
            [
                "rotate",
                "--current",
                str(tmp_path / "1.root"),
                "--sign",
                str(keys_dir / "root.key"),
                "--sign",
                str(keys_dir / "root2.key"),
                "--add-root-key",
                str(keys_dir / "root2.pub"),
                "--remove-root-key",
                str(keys_dir / "root.pub"),
                "--add-policy-key",
                str(keys_dir / "policy2.pub"),
                "--remove-policy-key",
                str(keys_dir / "policy.pub"),
                "--now",
                "1796000000",
                "--out",
                str(tmp_path / "2.root"),
            ],
        )
    )
    assert read_envelope(tmp_path / "2.root").payload_type.endswith("root.v1+proto")
    # Signed only by the new root key: refused (the old root must sign too).
    refused = runner.invoke(
        keys,
        [
            "rotate",
            "--current",
            str(tmp_path / "2.root"),
            "--sign",
            str(keys_dir / "root.key"),
            "--out",
            str(tmp_path / "3.root"),
        ],
    )
    assert refused.exit_code != 0 and "current root" in refused.output
    assert not (tmp_path / "3.root").exists()

    new_policy = tmp_path / "new.policy"
    _sign(runner, keys_dir / "policy2.key", new_policy)
    chain = [
        "--root",
        str(tmp_path / "2.root"),
        "--root",
        str(tmp_path / "1.root"),
        "--pin",
        str(keys_dir / "root.pub"),
    ]
    _ok(runner.invoke(policy, ["verify", str(new_policy), *chain, "--now", VALID_AT]))
    old_policy = tmp_path / "old.policy"
    _sign(runner, keys_dir / "policy.key", old_policy)
    result = runner.invoke(policy, ["verify", str(old_policy), *chain, "--now", VALID_AT])
    assert result.exit_code == 1 and "UnknownKeyError" in result.output


def test_show_and_verify_print_epsilon_and_charge_per_report(
    runner: CliRunner, tmp_path: Path
) -> None:
    keys_dir = _setup(runner, tmp_path)
    labels = ", ".join(f'"v{i}"' for i in range(64))
    text = EXAMPLE.read_text()
    text = text.replace(
        'values = ["news", "search", "social", "video", "shopping", "other"]',
        f"values = [{labels}]",
    )
    text = text.replace('id = "grr"', 'id = "rappor-grr"').replace(
        'epsilon = "1.0"', 'epsilon = "0.5"'
    )
    text = text.replace('memo_charging = "none"', 'memo_charging = "joint"')
    text = text.replace('# g = "4"', 'epsilon_permanent = "2"')
    source = tmp_path / "memo.toml"
    source.write_text(text)
    envelope_path = tmp_path / "memo.policy"
    signed = _ok(
        runner.invoke(
            policy,
            [
                "sign",
                str(source),
                "--key",
                str(keys_dir / "policy.key"),
                "--out",
                str(envelope_path),
            ],
        )
    )
    # The author sees what a window can lose over any values, and what memoization costs.
    assert "charge: 2.192184 per report (epsilon 0.5)" in signed
    assert "admits 1 report(s): worst-case loss per window 2.192184 over any values" in signed
    assert "the retired r* rule charged 0.738803" in signed
    assert "there is no lifetime cap" in signed
    shown = json.loads(_ok(runner.invoke(policy, ["show", str(envelope_path)])))
    assert (shown["epsilon_per_report"], shown["charge_per_report"]) == ("0.5", "2.192184")
    verified = _ok(
        runner.invoke(
            policy,
            [
                "verify",
                str(envelope_path),
                "--root",
                str(tmp_path / "1.root"),
                "--pin",
                str(keys_dir / "root.pub"),
                "--now",
                VALID_AT,
            ],
        )
    )
    assert "epsilon 0.5 per report, charge 2.192184 per report" in verified
