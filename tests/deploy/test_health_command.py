"""`fedldp collector health` against a real collector on port 0: plaintext, TLS and
mutual TLS; exit 0 only on SERVING, 1 with one line otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from collector_testkit import Deployment, free_port
from deploy_testkit import TlsMaterial
from fedldp.collector.server import (
    SERVICE_NAME,
    RunningCollector,
    _AsyncTransport,
    start_collector,
)
from grpc_health.v1 import health_pb2

from fedldp.cli import main


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    d = Deployment.create(now=int(time.time()))
    d.add_categorical("color", labels=("red", "green"), epsilon="0.5", epsilon_cap="2")
    return d


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return TlsMaterial.create(tmp_path_factory.mktemp("tls"))


def _start(deployment: Deployment, folder: Path, **settings: object) -> RunningCollector:
    config = deployment.config(f"sqlite:///{folder / 'ledger.db'}", **settings)
    return start_collector(config, registry=deployment.registry())


@pytest.fixture(params=["sync", "asyncio"])
def plain(
    request: pytest.FixtureRequest, deployment: Deployment, tmp_path: Path
) -> Iterator[RunningCollector]:
    running = _start(deployment, tmp_path, server=request.param)
    yield running
    running.stop(1.0)


def _health(*args: str) -> Result:
    return CliRunner().invoke(main, ["collector", "health", *args])


def _one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: ")
    return lines[0]


def test_plaintext_serving_exits_0(plain: RunningCollector) -> None:
    result = _health("--addr", plain.address)
    assert (result.exit_code, result.output) == (0, "SERVING\n")
    whole_server = _health("--addr", plain.address, "--service", "", "--timeout", "3")
    assert whole_server.exit_code == 0


def test_the_installed_command_exits_0_then_1_once_stopped(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The real `fedldp` executable, as a HEALTHCHECK runs it."""
    running = _start(deployment, tmp_path)
    command = [sys.executable, "-m", "fedldp.cli", "collector", "health", "--addr"]
    up = subprocess.run([*command, running.address], capture_output=True, text=True, check=False)
    assert (up.returncode, up.stdout) == (0, "SERVING\n"), up.stderr
    running.stop(1.0)
    down = subprocess.run(
        [*command, running.address, "--timeout", "2"], capture_output=True, text=True, check=False
    )
    assert down.returncode == 1
    assert len(down.stderr.strip().splitlines()) == 1
    assert "UNAVAILABLE" in down.stderr


def test_not_serving_exits_1(plain: RunningCollector) -> None:
    transport, status = plain.transport, health_pb2.HealthCheckResponse.NOT_SERVING
    if isinstance(transport, _AsyncTransport):  # its set() is a coroutine on the server's loop
        asyncio.run_coroutine_threadsafe(
            transport.health.set(SERVICE_NAME, status), transport.loop
        ).result()
    else:
        transport.health.set(SERVICE_NAME, status)
    line = _one_error_line(_health("--addr", plain.address))
    assert "is NOT_SERVING" in line


def test_unknown_service_and_nothing_listening_exit_1(plain: RunningCollector) -> None:
    line = _one_error_line(_health("--addr", plain.address, "--service", "no.such.Service"))
    assert "NOT_FOUND" in line
    line = _one_error_line(_health("--addr", f"127.0.0.1:{free_port()}", "--timeout", "2"))
    assert "UNAVAILABLE" in line


def test_bad_arguments_are_usage_errors(plain: RunningCollector, tls: TlsMaterial) -> None:
    assert _health("--addr", plain.address, "--ca", str(tls.ca)).exit_code == 2
    assert _health("--addr", plain.address, "--timeout", "0").exit_code == 2
    half = _health("--addr", plain.address, "--tls", "--cert", str(tls.client_cert))
    assert half.exit_code == 2 and "--cert and --key go together" in half.output


@pytest.mark.parametrize("server", ["sync", "asyncio"])
def test_tls(deployment: Deployment, tmp_path: Path, tls: TlsMaterial, server: str) -> None:
    running = _start(
        deployment,
        tmp_path,
        server=server,
        tls_cert=str(tls.server_cert),
        tls_key=str(tls.server_key),
    )
    try:
        ok = _health("--addr", f"localhost:{running.port}", "--tls", "--ca", str(tls.ca))
        assert (ok.exit_code, ok.output) == (0, "SERVING\n")
        # The container's own check dials 127.0.0.1 and names the certificate's host.
        by_ip = _health(
            "--addr", running.address, "--tls", "--ca", str(tls.ca), "--server-name", "localhost"
        )
        assert by_ip.exit_code == 0, by_ip.output
        # The same from the environment, as the image's HEALTHCHECK runs it.
        env = {
            "FEDLDP_HEALTH_ADDR": running.address,
            "FEDLDP_HEALTH_TLS": "1",
            "FEDLDP_HEALTH_CA": str(tls.ca),
            "FEDLDP_HEALTH_SERVER_NAME": "localhost",
        }
        from_env = CliRunner().invoke(main, ["collector", "health"], env=env)
        assert (from_env.exit_code, from_env.output) == (0, "SERVING\n")
        # Plaintext against TLS, an untrusted CA, the wrong name: refused, one line each.
        for args in (
            ("--addr", running.address, "--timeout", "2"),
            ("--addr", running.address, "--tls", "--ca", str(tls.other_ca), "--timeout", "2"),
            ("--addr", running.address, "--tls", "--ca", str(tls.ca), "--timeout", "2"),
        ):
            assert "UNAVAILABLE" in _one_error_line(_health(*args))
    finally:
        running.stop(1.0)


def test_mutual_tls_needs_the_client_certificate(
    deployment: Deployment, tmp_path: Path, tls: TlsMaterial
) -> None:
    running = _start(
        deployment,
        tmp_path,
        tls_cert=str(tls.server_cert),
        tls_key=str(tls.server_key),
        tls_client_ca=str(tls.ca),
        mtls=True,
        token_secret="",
    )
    base = ["--addr", f"localhost:{running.port}", "--tls", "--ca", str(tls.ca)]
    try:
        without = _health(*base, "--timeout", "2")
        assert "UNAVAILABLE" in _one_error_line(without)
        with_cert = _health(*base, "--cert", str(tls.client_cert), "--key", str(tls.client_key))
        assert (with_cert.exit_code, with_cert.output) == (0, "SERVING\n")
    finally:
        running.stop(1.0)
