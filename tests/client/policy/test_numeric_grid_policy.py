"""Numeric policies state their grid when authored; laplace is refused everywhere.

* authoring (Authority.numeric_policy and the TOML path) writes the derived
  "levels" and "cells" into the signed params, keeps explicit ones, and refuses
  invalid ones with a specific problem;
* a policy signed without them (before the grid existed) still verifies and
  builds the same mechanism as the stated defaults;
* "laplace" is refused at authoring and, signed by a buggy or old signer, at
  verification (devices and collectors), with a message naming the replacement.
"""

from __future__ import annotations

import copy
import importlib
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.authoring import Authority, policy_from_dict, sign_envelope
from fedldp.client.mechanisms.numeric import DEFAULT_LEVELS, default_band
from fedldp.client.policy import InvalidPolicyError, TrustStore, verify_policy
from fedldp.client.policy.envelope import POLICY_PAYLOAD_TYPE
from fedldp.v1 import policy_pb2

# tomllib from Python 3.11; the collector extra's backport, tomli, on 3.10.
tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

DAY = 86400
EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "policies" / "example-policy.toml"


def numeric(authority: Authority, now: int, mechanism: str, **params: str) -> policy_pb2.Policy:
    return authority.numeric_policy(
        policy_id="latency",
        metric="net.latency_ms",
        lo="0",
        hi="250",
        epsilon="2",
        epsilon_cap="4",
        window_seconds=DAY,
        now=now,
        mechanism=mechanism,
        params=params or None,
    )


@pytest.mark.parametrize("mechanism", ["piecewise", "hybrid"])
def test_authoring_states_the_derived_grid(
    authority: Authority, trust: TrustStore, now: int, mechanism: str
) -> None:
    policy = numeric(authority, now, mechanism)
    cells = DEFAULT_LEVELS + default_band(Decimal(2), DEFAULT_LEVELS)
    assert dict(policy.mechanism.params) == {"levels": str(DEFAULT_LEVELS), "cells": str(cells)}
    verified = verify_policy(authority.sign(policy), trust, now=now)
    assert (verified.mechanism.levels, verified.mechanism.cells) == (DEFAULT_LEVELS, cells)  # type: ignore[attr-defined]

    explicit = numeric(authority, now, mechanism, levels="32")
    assert dict(explicit.mechanism.params) == {"levels": "32", "cells": str(32 + 12)}


def test_duchi_takes_no_grid(authority: Authority, now: int) -> None:
    assert dict(numeric(authority, now, "duchi").mechanism.params) == {}
    with pytest.raises(InvalidPolicyError, match="no parameters"):
        numeric(authority, now, "duchi", levels="8")


@pytest.mark.parametrize(
    ("params", "problem"),
    [({"levels": "1"}, "levels"), ({"levels": "64", "cells": "200"}, "cells"), ({"w": "3"}, "w")],
)
def test_authoring_refuses_a_bad_grid(
    authority: Authority, now: int, params: dict[str, str], problem: str
) -> None:
    with pytest.raises(InvalidPolicyError, match=problem):
        numeric(authority, now, "piecewise", **params)


def test_a_policy_signed_without_the_grid_gets_the_same_defaults(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    stated = numeric(authority, now, "hybrid")
    bare = copy.deepcopy(stated)
    bare.mechanism.params.clear()
    old = verify_policy(
        sign_envelope(POLICY_PAYLOAD_TYPE, bare.SerializeToString(), [authority.policy_key]),
        trust,
        now=now,
    )
    new = verify_policy(authority.sign(stated), trust, now=now)
    assert old.mechanism.table == new.mechanism.table  # type: ignore[attr-defined]


def test_toml_numeric_policy_states_its_grid() -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    del data["metric"]["values"]
    data["metric"].update(lo="0", hi="10")
    data["mechanism"] = {"id": "piecewise", "epsilon": "1", "params": {"levels": "64"}}
    policy = policy_from_dict(data)
    assert dict(policy.mechanism.params) == {"levels": "64", "cells": str(64 + 39)}


def test_laplace_is_refused_when_authored(authority: Authority, now: int) -> None:
    with pytest.raises(InvalidPolicyError, match=r"retired.*hybrid"):
        numeric(authority, now, "laplace")
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    del data["metric"]["values"]
    data["metric"].update(lo="0", hi="10")
    data["mechanism"] = {"id": "laplace", "epsilon": "1"}
    with pytest.raises(InvalidPolicyError, match=r"retired.*hybrid"):
        policy_from_dict(data)


def test_a_signed_laplace_policy_is_refused_at_verification(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    policy = numeric(authority, now, "duchi")
    policy.mechanism.id = "laplace"
    # An old or buggy signer: sign_envelope does not validate.
    envelope = sign_envelope(
        POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [authority.policy_key]
    )
    with pytest.raises(InvalidPolicyError, match="mechanism 'laplace' is retired") as info:
        verify_policy(envelope, trust, now=now)
    assert "hybrid" in str(info.value)
