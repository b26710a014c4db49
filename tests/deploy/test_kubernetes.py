"""deploy/kubernetes/*.yaml: validated offline with kubernetes-validate (strict)
for several Kubernetes versions, and checked against the collector they run:
probes on the gRPC health service consistent with TLS, every configured path
provided by the projected volume, memory limits above the collector's
documented bound, a locked-down securityContext on every pod, selectors that
match. No cluster runs here: the manifests are not applied by these tests."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from deploy_testkit import cli_accepts
from fedldp.collector.config import CollectorConfig, load_config
from fedldp.collector.server import SERVICE_NAME

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra has it)"
)

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]
MIB = 1 << 20
#: The collector process's own memory besides requests in flight (measured 86-134 MB).
PROCESS_BASELINE = 150 * MIB


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(KUBE.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    return docs


DOCS = _documents()


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in DOCS:
        spec = doc["spec"] if doc["kind"] in ("Deployment", "StatefulSet", "Job") else None
        if doc["kind"] == "CronJob":
            spec = doc["spec"]["jobTemplate"]["spec"]
        if spec is not None:
            yield doc["metadata"]["name"], spec["template"]


@pytest.mark.parametrize("version", VERSIONS)
def test_strict_validation(version: str) -> None:
    for doc in DOCS:
        kubernetes_validate.validate(doc, version, strict=True)
    # Strict validation rejects what a cluster would (a broken variant).
    broken = copy.deepcopy(_one("Deployment", "fedldp-collector"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_every_part_is_defined() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in DOCS}
    for expected in [
        ("Deployment", "fedldp-collector"),
        ("Service", "fedldp-collector"),
        ("ServiceAccount", "fedldp-collector"),
        ("PodDisruptionBudget", "fedldp-collector"),
        ("HorizontalPodAutoscaler", "fedldp-collector"),
        ("NetworkPolicy", "fedldp-collector"),
        ("ConfigMap", "fedldp-collector-config"),
        ("ConfigMap", "fedldp-trust"),
        ("ConfigMap", "fedldp-policies"),
        ("Secret", "fedldp-ledger"),
        ("Secret", "fedldp-collector-secrets"),
        ("Secret", "fedldp-collector-tls"),
        ("Job", "fedldp-migrate"),
        ("CronJob", "fedldp-reconcile"),
        ("StatefulSet", "fedldp-ledger-db"),
        ("Service", "fedldp-ledger-db"),
        ("NetworkPolicy", "fedldp-ledger-db"),
    ]:
        assert expected in kinds, expected


@pytest.mark.parametrize("name", [name for name, _ in _pod_specs()])
def test_every_pod_is_locked_down(name: str) -> None:
    template = dict(_pod_specs())[name]
    spec = template["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        limits = container["resources"]["limits"]
        assert "memory" in limits and "cpu" in limits
        # With a read-only root, /tmp is a volume.
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts
        if container["image"].startswith("registry.example/fedldp:"):
            cli_accepts(container["args"])


def _quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def _cpu(text: str) -> float:
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _collector() -> tuple[dict[str, Any], dict[str, Any], CollectorConfig]:
    deployment = _one("Deployment", "fedldp-collector")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    toml = _one("ConfigMap", "fedldp-collector-config")["data"]["collector.toml"]
    env = {e["name"]: e.get("value", "from-a-secret") for e in container["env"]}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "collector.toml"
        path.write_text(toml, encoding="utf-8")
        config = load_config(path, env=env)
    return pod, container, config


def probe_problems(container: dict[str, Any], config: CollectorConfig) -> list[str]:
    """Why `container`'s probes do not check the gRPC health service the way
    `config`'s collector serves it (TLS: exec `fedldp collector health --tls`;
    plaintext: the native grpc probe on the listen port)."""
    port = int(config.listen.rsplit(":", 1)[1])
    problems = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe is None:
            problems.append(f"{kind} missing")
        elif config.tls_cert:
            argv = probe.get("exec", {}).get("command", [])
            if argv[:3] != ["fedldp", "collector", "health"] or "--tls" not in argv:
                problems.append(f"{kind}: TLS is on, so an exec probe with --tls")
            elif argv[argv.index("--addr") + 1] != f"127.0.0.1:{port}":
                problems.append(f"{kind}: not the listen port {port}")
        elif probe.get("grpc") != {"port": port, "service": SERVICE_NAME}:
            problems.append(f"{kind}: plaintext, so grpc: {{port: {port}}}")
    return problems


def test_probes_use_the_grpc_health_service_consistently_with_tls() -> None:
    pod, container, config = _collector()
    assert config.tls_cert, "the shipped manifests serve TLS"
    assert probe_problems(container, config) == []
    argv = container["readinessProbe"]["exec"]["command"]
    cli_accepts(argv[1:])
    assert pod["terminationGracePeriodSeconds"] > config.drain_seconds
    # Broken variants: the native probe against TLS; an exec probe without --tls.
    native = copy.deepcopy(container)
    native["livenessProbe"] = {"grpc": {"port": 7443}}
    assert probe_problems(native, config) == [
        "livenessProbe: TLS is on, so an exec probe with --tls"
    ]
    plain_exec = copy.deepcopy(container)
    plain_exec["readinessProbe"]["exec"]["command"] = [a for a in argv if a != "--tls"]
    assert probe_problems(plain_exec, config)
    plaintext = CollectorConfig(ledger_url="x", listen="0.0.0.0:7443")
    assert probe_problems(container, plaintext)


def test_every_configured_path_is_in_the_projected_volume() -> None:
    pod, container, config = _collector()
    (etc_mount,) = [m for m in container["volumeMounts"] if m["name"] == "etc"]
    assert etc_mount["readOnly"] is True
    (etc,) = [v for v in pod["volumes"] if v["name"] == "etc"]
    root = PurePosixPath(etc_mount["mountPath"])
    provided: set[PurePosixPath] = set()
    for source in etc["projected"]["sources"]:
        (kind,) = source
        ref = source[kind]
        resource = _one("ConfigMap" if kind == "configMap" else "Secret", ref["name"])
        keys = {**resource.get("data", {}), **resource.get("binaryData", {})}
        keys.update(resource.get("stringData", {}))
        for item in ref["items"]:
            assert item["key"] in keys, f"{ref['name']} has no key {item['key']}"
            binary = item["key"].endswith((".root", ".policy"))
            assert not binary or item["key"] in resource.get("binaryData", {}), item["key"]
            provided.add(root / item["path"])
    args, probe = container["args"], container["readinessProbe"]["exec"]["command"]
    files = [
        args[args.index("--config") + 1],
        config.token_secret_file,
        config.tls_cert,
        config.tls_key,
        probe[probe.index("--ca") + 1],
    ]
    for file in files:
        assert PurePosixPath(file) in provided, file
    trust, policies = PurePosixPath(config.trust_dir), PurePosixPath(config.policy_dir)
    assert any(p.parent == trust / "pinned" and p.suffix == ".pem" for p in provided)
    assert any(p.parent == trust and p.suffix == ".root" for p in provided)
    assert any(p.parent == policies and p.suffix == ".policy" for p in provided)


def test_memory_limit_covers_the_documented_bound() -> None:
    _, container, config = _collector()
    # deploy/collector.toml: one process stays under 384 MiB at the default byte
    # budget; the older, looser bound (max_concurrent_rpcs x max_message_bytes x 3
    # plus the process) still fits, and is what this checks.
    bound = config.processes * (
        config.max_concurrent_rpcs * config.max_message_bytes * 3 + PROCESS_BASELINE
    )
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert _quantity(limits["memory"]) >= bound
    assert _quantity(requests["memory"]) <= _quantity(limits["memory"])
    assert _cpu(limits["cpu"]) >= config.processes, "one process uses about one core"


def test_selectors_match() -> None:
    deployment = _one("Deployment", "fedldp-collector")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    for kind in ("PodDisruptionBudget",):
        assert _one(kind, "fedldp-collector")["spec"]["selector"]["matchLabels"] == selector
    assert _one("Service", "fedldp-collector")["spec"]["selector"] == selector
    assert _one("NetworkPolicy", "fedldp-collector")["spec"]["podSelector"]["matchLabels"] == (
        selector
    )
    hpa = _one("HorizontalPodAutoscaler", "fedldp-collector")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "fedldp-collector" and hpa["minReplicas"] >= 2
    assert (
        _one("PodDisruptionBudget", "fedldp-collector")["spec"]["maxUnavailable"]
        < (hpa["minReplicas"])
    )
    # Only pods labelled as ledger clients reach PostgreSQL; every fedldp pod is one.
    db_policy = _one("NetworkPolicy", "fedldp-ledger-db")["spec"]
    allowed = db_policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for name, template in _pod_specs():
        if name != "fedldp-ledger-db":
            assert allowed.items() <= template["metadata"]["labels"].items(), name
    statefulset = _one("StatefulSet", "fedldp-ledger-db")["spec"]
    assert statefulset["serviceName"] == "fedldp-ledger-db"
    assert _one("Service", "fedldp-ledger-db")["spec"]["clusterIP"] == "None"
