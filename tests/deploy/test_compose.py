"""deploy/compose/compose.yaml: valid against the Compose Specification's JSON
schema (vendored, tests/deploy/vendor), loaded, and consistent with the collector
it runs: its environment is a valid collector configuration, the health check
speaks TLS exactly when the collector does, every command is one the `fedldp`
CLI accepts, the migration finishes before any collector serves, and the Envoy
configuration (deploy/envoy/envoy.yaml) routes to the replicas' port and
health-checks their gRPC health service. No container engine runs here: the
file is not started by these tests (docs/operations.md says so)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_testkit import cli_accepts
from fedldp.collector.config import load_config
from fedldp.collector.server import SERVICE_NAME

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
ENVOY = ROOT / "deploy" / "envoy" / "envoy.yaml"
SCHEMA = Path(__file__).parent / "vendor" / "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
FEDLDP_SERVICES = ("migrate", "collector", "report", "reconcile")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def envoy() -> dict[str, Any]:
    data = yaml.safe_load(ENVOY.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    raw = SCHEMA.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == SCHEMA_SHA256
    schema = json.loads(raw)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # The schema does reject what Compose rejects (a broken variant).
    broken = {**compose, "services": {"x": {"image": "a", "restart": ["no"]}}}
    assert list(validator.iter_errors(broken))


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    assert isinstance(command, list), "exec form only"
    return [str(c) for c in command]


def test_every_fedldp_command_is_one_thecli_accepts(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in FEDLDP_SERVICES:
        cli_accepts(_command(services[name]))
        assert services[name]["image"] == "fedldp:0.1.0"
        assert services[name]["build"]["dockerfile"] == "deploy/Containerfile"
    cli_accepts(services["collector"]["healthcheck"]["test"][2:])
    assert _command(services["migrate"])[:2] == ["ledger", "migrate"]
    assert (COMPOSE.parent / services["collector"]["build"]["context"]).resolve() == ROOT


def test_migration_runs_before_collectors_serve(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate, collector = services["migrate"], services["collector"]
    assert migrate["depends_on"]["ledger-db"] == {"condition": "service_healthy"}
    assert migrate["restart"] == "no"
    assert collector["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["envoy"]["depends_on"]["collector"] == {"condition": "service_healthy"}
    assert collector["deploy"]["replicas"] >= 2


def _collector_config(compose: dict[str, Any], service: str) -> Any:
    env = {k: str(v) for k, v in compose["services"][service]["environment"].items()}
    toml = compose["configs"]["collector_toml"]["file"]
    return load_config(COMPOSE.parent / toml, env=env)


def test_environment_is_a_valid_collector_configuration(compose: dict[str, Any]) -> None:
    for name in FEDLDP_SERVICES:
        cfg = _collector_config(compose, name)
        assert cfg.ledger_url.startswith("postgresql+psycopg://fedldp@ledger-db:5432/")
        service = compose["services"][name]
        # The password is never in the environment: libpq reads the pgpass secret.
        assert service["environment"]["PGPASSFILE"] == "/run/secrets/pgpass"
        assert "pgpass" in service["secrets"]
        assert not any("PASSWORD" in k for k in service["environment"])
        # Read-only root filesystem, no privileges, unprivileged user, /tmp on tmpfs.
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
        assert service["user"] == "10001:10001"
        assert any(t.startswith("/tmp") for t in service["tmpfs"])


def test_health_check_speaks_tls_exactly_when_the_collector_does(
    compose: dict[str, Any],
) -> None:
    collector = compose["services"]["collector"]
    cfg = _collector_config(compose, "collector")
    test = collector["healthcheck"]["test"]
    assert test[:4] == ["CMD", "fedldp", "collector", "health"]
    assert test[test.index("--addr") + 1] == f"127.0.0.1:{cfg.listen.rsplit(':', 1)[1]}"
    assert bool(cfg.tls_cert) == ("--tls" in test)
    mounted = {f"/run/secrets/{s}" for s in collector["secrets"]}
    assert {cfg.tls_cert, cfg.tls_key, cfg.token_secret_file} <= mounted
    assert test[test.index("--ca") + 1] in mounted
    assert not cfg.mtls, "behind a TLS-terminating Envoy the subject comes from tokens"
    timeout = float(test[test.index("--timeout") + 1])
    assert timeout < float(collector["healthcheck"]["timeout"].rstrip("s"))


def test_secrets_configs_and_ports(compose: dict[str, Any]) -> None:
    declared = set(compose["secrets"])
    for name, service in compose["services"].items():
        assert set(service.get("secrets", [])) <= declared, name
    for secret in compose["secrets"].values():
        assert secret["file"].startswith("./secrets/")
    for config in compose["configs"].values():
        assert (COMPOSE.parent / config["file"]).is_file()
    published = {p["target"]: p for p in compose["services"]["envoy"]["ports"]}
    assert published[8443]["published"] == "7443"
    assert published[9901]["host_ip"] == "127.0.0.1", "Envoy's admin stays on loopback"
    metrics = compose["services"]["collector"]["ports"]
    assert metrics == [{"target": 9464, "host_ip": "127.0.0.1", "protocol": "tcp"}]


def test_envoy_routes_to_healthy_replicas_over_tls(
    compose: dict[str, Any], envoy: dict[str, Any]
) -> None:
    cfg = _collector_config(compose, "collector")
    (listener,) = envoy["static_resources"]["listeners"]
    (cluster,) = envoy["static_resources"]["clusters"]
    published = {p["target"] for p in compose["services"]["envoy"]["ports"]}
    assert listener["address"]["socket_address"]["port_value"] in published
    assert envoy["admin"]["address"]["socket_address"]["port_value"] in published
    (chain,) = listener["filter_chains"]
    hcm = chain["filters"][0]["typed_config"]
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    (route,) = vhost["routes"]
    assert route["match"]["prefix"] == f"/{SERVICE_NAME}/"
    assert route["route"]["cluster"] == cluster["name"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    address = endpoint["address"]["socket_address"]
    assert address["address"] == "collector", "the compose service name (every replica)"
    assert str(address["port_value"]) == cfg.listen.rsplit(":", 1)[1]
    assert cluster["type"] == "STRICT_DNS"
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"]["service_name"] == SERVICE_NAME
    h2 = cluster["typed_extension_protocol_options"]
    assert "http2_protocol_options" in next(iter(h2.values()))["explicit_http_config"]
    # TLS to the replicas because the collectors serve TLS; the name checked is the one
    # the compose health check verifies.
    assert bool(cfg.tls_cert) == ("transport_socket" in cluster)
    upstream = cluster["transport_socket"]["typed_config"]
    health_test = compose["services"]["collector"]["healthcheck"]["test"]
    assert upstream["sni"] == health_test[health_test.index("--server-name") + 1]
    envoy_secrets = {f"/run/secrets/{s}" for s in compose["services"]["envoy"]["secrets"]}
    files = {
        upstream["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
        *(
            c[k]["filename"]
            for c in chain["transport_socket"]["typed_config"]["common_tls_context"][
                "tls_certificates"
            ]
            for k in ("certificate_chain", "private_key")
        ),
    }
    assert files <= envoy_secrets


# --- secrets the container users can read (issue 29, item 9) ---

OPERATIONS = ROOT / "docs" / "operations.md"
#: The user of the images that set none in compose.yaml: the official postgres image
#: runs PostgreSQL as `postgres`, uid 999 (its Dockerfile: useradd --uid=999).
IMAGE_USERS = {"postgres": 999}
#: Who creates the secret files (not root, not a container user).
OPERATOR = 1000


def _compose_block() -> str:
    """The ```sh block of docs/operations.md that starts with `cd deploy/compose`."""
    text = OPERATIONS.read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```sh\n")[1:]]
    (block,) = [b for b in blocks if b.startswith("cd deploy/compose")]
    return block


def _files_after(block: str, names: set[str]) -> dict[str, tuple[int, int]]:
    """(owner uid, mode) of each secrets/NAME after the block's umask, chown and chmod
    lines (compose bind-mounts file secrets as they are on the host)."""
    umask = 0o022  # the usual login default, until the block sets one
    state: dict[str, tuple[int, int]] = {}
    for raw in block.splitlines():
        words = raw.split("#", 1)[0].split()
        if words[:1] == ["sudo"]:
            words = words[1:]
        if words[:1] == ["umask"]:
            umask = int(words[1], 8)
        elif words[:1] == ["chown"] or words[:1] == ["chmod"]:
            files = [w for w in words[2:] if w.startswith("secrets/")]
            targets = (
                names if files == ["secrets/*"] else {f.removeprefix("secrets/") for f in files}
            )
            for name in targets:
                owner, mode = state.get(name, (OPERATOR, 0o666 & ~umask))
                if words[0] == "chown":
                    owner = int(words[1].split(":")[0])
                else:
                    mode = int(words[1], 8)
                state[name] = (owner, mode)
    return {n: state.get(n, (OPERATOR, 0o666 & ~umask)) for n in names}


def _unreadable(compose: dict[str, Any], block: str) -> list[str]:
    """`service: secret` for every secret a service mounts that its user cannot read,
    and every secret left readable by others that is not a certificate."""
    files = _files_after(block, set(compose["secrets"]))
    problems = []
    for name, service in compose["services"].items():
        user = service.get("user")
        uid = int(user.split(":")[0]) if user else IMAGE_USERS[service["image"].split(":")[0]]
        for secret in service.get("secrets", []):
            owner, mode = files[secret]
            if not ((owner == uid and mode & 0o400) or mode & 0o004):
                problems.append(f"{name}: {secret} (owner {owner}, mode {mode:o}) unreadable")
    for secret, (_, mode) in files.items():
        if mode & 0o077 and not secret.endswith(".pem"):
            problems.append(f"{secret}: mode {mode:o} lets others read a private file")
    return problems


def test_every_service_can_read_the_secrets_it_mounts(compose: dict[str, Any]) -> None:
    """The operations.md steps leave each secret readable by the container user that
    mounts it and private otherwise (compose ignores uid/gid/mode for file secrets)."""
    assert _unreadable(compose, _compose_block()) == []


def test_the_secret_check_fails_on_the_old_steps(compose: dict[str, Any]) -> None:
    """The steps the docs had (issue 29): Envoy, PostgreSQL and the collectors' TLS
    files were 0600 and owned by the operator."""
    old = (
        "cd deploy/compose\n"
        "sudo chown 10001:10001 secrets/pgpass secrets/token.secret secrets/collector.key\n"
        "chmod 600 secrets/*\n"
    )
    problems = _unreadable(compose, old)
    assert "envoy: envoy.key (owner 1000, mode 600) unreadable" in problems
    assert "ledger-db: db_password (owner 1000, mode 600) unreadable" in problems
    assert "collector: ca.pem (owner 1000, mode 600) unreadable" in problems
    # Without a umask, the files are made 0644: private ones readable by everyone.
    assert "token.secret: mode 644 lets others read a private file" in _unreadable(
        compose, "cd deploy/compose\n"
    )
