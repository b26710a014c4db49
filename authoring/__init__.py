"""Policy authoring: keys, roots, signed policies, and their files (the tooling side).

Devices never sign: the device package (`fedldp.client`) holds verification only
and imports nothing from here. Authoring is what `fedldp keys` and `fedldp
policy` run, and what tests and the demo use to make a throwaway authority:

* `fedldp.authoring.signing`: `generate_key`, `sign_envelope`, `make_root`,
  `next_root` (the TUF rotation rule checked before signing), `sign_policy`;
* `fedldp.authoring.policies`: policy TOML to a validated `fedldp.v1.Policy`
  (`load_policy_toml`, `policy_from_dict`) and `successor_problems`;
* `fedldp.authoring.key_files`: private and public key files, envelope files;
* `fedldp.authoring.authority`: `Authority`, one root key and one policy key for
  demos and tests.

Base install only: cryptography and protobuf (TOML reading uses tomllib, or
tomli on Python 3.10).
"""

from fedldp.authoring.authority import Authority, PolicyFields
from fedldp.authoring.key_files import (
    KeyFileError,
    load_private_key,
    write_envelope,
    write_private_key,
    write_public_key,
)
from fedldp.authoring.policies import (
    load_policy_toml,
    parse_duration,
    policy_from_dict,
    successor_problems,
)
from fedldp.authoring.signing import (
    generate_key,
    make_root,
    next_root,
    public_key_entry,
    sign_envelope,
    sign_policy,
    sign_root,
)

__all__ = [
    "Authority",
    "KeyFileError",
    "PolicyFields",
    "generate_key",
    "load_policy_toml",
    "load_private_key",
    "make_root",
    "next_root",
    "parse_duration",
    "policy_from_dict",
    "public_key_entry",
    "sign_envelope",
    "sign_policy",
    "sign_root",
    "successor_problems",
    "write_envelope",
    "write_private_key",
    "write_public_key",
]
