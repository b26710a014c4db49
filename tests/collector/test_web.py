"""The collector's web endpoint (collector/web.py, issue 31 item 3): the Connect
protocol and gRPC-Web beside gRPC, sharing the servicer.

Every refusal the collector makes is provoked over gRPC, the Connect protocol and
gRPC-Web against the same running collector and must come back with the same
status code, the same message and the same retry hint's presence. The shared path
is checked through its effects: one ledger (a report accepted over the web is a
DUPLICATE over gRPC), one metrics registry, one admission (a gRPC call holding the
only RPC slot or a subject's share refuses web calls). CORS and the origin gate,
the content-type gate, the configuration checks, and `fedldp collector serve` with
two processes sharing the web port are checked too. The web calls are made with
the standard library's HTTP client, so the wire format itself is what is tested.
"""

from __future__ import annotations

import http.client
import json
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report, spawn, write_config
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.admission import Admission
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.config import CollectorConfig, ConfigError
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from stalled_bodies import StalledBodies

pytest.importorskip("connectrpc", reason="the web extra (connect-python) is not installed")
pytest.importorskip("hypercorn", reason="the web extra (hypercorn) is not installed")

ORIGIN = "https://app.example"
Answer = tuple[str, str, bool]  # status code name, message, whether a retry-after-ms came


def _grpc(address: str, method: str, body: bytes, token: str | None) -> Answer:
    """One gRPC call of raw `body`; its status, message and hint presence."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/fedldp.v1.Collector/{method}", request_serializer=None, response_deserializer=None
        )
        metadata = bearer_metadata(token) if token else ()
        try:
            call(body, metadata=metadata, timeout=20)
        except grpc.RpcError as exc:
            error: Any = exc  # a grpc.Call as well
            trailers = {key for key, _ in error.trailing_metadata() or ()}
            return error.code().name, error.details() or "", "retry-after-ms" in trailers
    return "OK", "", False


def _post(
    port: int, method: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """POST `body` to the web endpoint; status, headers (lower-case) and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", f"/fedldp.v1.Collector/{method}", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _connect(port: int, method: str, body: bytes, token: str | None) -> Answer:
    """One Connect-protocol unary call (binary protobuf)."""
    status, headers, data = _post(
        port, method, body, {"content-type": "application/proto", **_auth(token)}
    )
    if status == 200:
        return "OK", "", False
    error = json.loads(data)
    return error["code"].upper(), error.get("message", ""), "trailer-retry-after-ms" in headers


def _grpc_web(port: int, method: str, body: bytes, token: str | None) -> Answer:
    """One gRPC-Web call (binary): the status from the trailer frame or the headers."""
    framed = b"\0" + struct.pack(">I", len(body)) + body
    status, headers, data = _post(
        port,
        method,
        framed,
        {"content-type": "application/grpc-web+proto", "x-grpc-web": "1", **_auth(token)},
    )
    assert status == 200
    trailers = dict(headers)
    while data:
        flag, size = data[0], struct.unpack(">I", data[1:5])[0]
        if flag & 0x80:
            for line in data[5 : 5 + size].decode().split("\r\n"):
                if ":" in line:
                    key, _, value = line.partition(":")
                    trailers[key.strip().lower()] = value.strip()
        data = data[5 + size :]
    code = grpc.StatusCode
    name = next(c.name for c in code if c.value[0] == int(trailers["grpc-status"]))
    from urllib.parse import unquote

    return name, unquote(trailers.get("grpc-message", "")), "retry-after-ms" in trailers


def _all(running: RunningCollector, method: str, body: bytes, token: str | None) -> list[Answer]:
    """The same call over gRPC, Connect and gRPC-Web."""
    assert running.web_port is not None
    return [
        _grpc(running.address, method, body, token),
        _connect(running.web_port, method, body, token),
        _grpc_web(running.web_port, method, body, token),
    ]


def _start(deployment: Deployment, sqlite_url: str, **overrides: Any) -> RunningCollector:
    values: dict[str, Any] = {
        "web_listen": "127.0.0.1:0",
        "web_allowed_origins": (ORIGIN,),
        **overrides,
    }
    return start_collector(deployment.config(sqlite_url, **values), registry=deployment.registry())


@pytest.fixture
def web(deployment: Deployment, sqlite_url: str) -> Iterator[RunningCollector]:
    running = _start(deployment, sqlite_url)
    yield running
    running.stop(1.0)


def _submit(deployment: Deployment, now: int, report_id: bytes | None = None) -> bytes:
    policy = deployment.verified(deployment.envelopes[0])
    report = make_report(policy, CategoryOutput(1), coarse_time=coarse(now), report_id=report_id)
    return pb.SubmitRequest(reports=[report]).SerializeToString()


def _same(answers: list[Answer], code: str, hint: bool) -> None:
    assert len(set(answers)) == 1, answers
    assert answers[0][0] == code and answers[0][2] is hint, answers


def test_shared_ledger_and_metrics(web: RunningCollector, deployment: Deployment, now: int) -> None:
    report_id = secrets.token_bytes(16)
    body = _submit(deployment, now, report_id)
    token = deployment.token("device-1")
    assert web.web_port is not None
    status, _, data = _post(
        web.web_port, "Submit", body, {"content-type": "application/proto", **_auth(token)}
    )
    assert status == 200
    assert pb.SubmitResponse.FromString(data).outcomes[0].outcome == pb.OUTCOME_ACCEPTED
    with grpc.insecure_channel(web.address) as channel:
        answer = channel.unary_unary(
            "/fedldp.v1.Collector/Submit",
            request_serializer=pb.SubmitRequest.SerializeToString,
            response_deserializer=pb.SubmitResponse.FromString,
        )(pb.SubmitRequest.FromString(body), metadata=bearer_metadata(token), timeout=20)
    assert answer.outcomes[0].outcome == pb.OUTCOME_DUPLICATE
    count = web.metrics.registry.get_sample_value(
        "fedldp_collector_requests_total", {"method": "Submit", "code": "OK"}
    )
    assert count == 2


def test_refusals_match(web: RunningCollector, deployment: Deployment, now: int) -> None:
    token = deployment.token("device-1")
    _same(_all(web, "GetPolicies", b"", None), "UNAUTHENTICATED", False)
    _same(_all(web, "GetPolicies", b"", "not-a-token"), "UNAUTHENTICATED", False)
    _same(_all(web, "Submit", b"\x0a\x05\x01", token), "INVALID_ARGUMENT", False)
    # A report under a policy the collector does not serve: refused by the service.
    policy = deployment.verified(deployment.envelopes[0])
    report = make_report(policy, CategoryOutput(1), coarse_time=coarse(now))
    report.policy_id = "no-such-policy"
    answers = _all(web, "Submit", pb.SubmitRequest(reports=[report]).SerializeToString(), token)
    assert len(set(answers)) == 1, answers


def test_too_large_refused_on_every_transport(deployment: Deployment, sqlite_url: str) -> None:
    running = _start(
        deployment,
        sqlite_url,
        max_message_bytes=1024,
        max_connection_inflight_bytes=65536,
        max_inflight_bytes=65536,
    )
    try:
        answers = _all(running, "Submit", b"\x08\x01" * 1024, deployment.token("device-1"))
        assert {a[0] for a in answers} == {"RESOURCE_EXHAUSTED"}, answers
        assert running.ledger.subject_spend("device-1") == []
    finally:
        running.stop(1.0)


def test_rate_limited_with_hint(deployment: Deployment, sqlite_url: str) -> None:
    running = _start(deployment, sqlite_url, rate_limit_per_second=0.001, rate_limit_burst=1.0)
    try:
        port = running.web_port
        assert port is not None
        calls: list[Callable[[str], Answer]] = [
            lambda token: _grpc(running.address, "GetPolicies", b"", token),
            lambda token: _connect(port, "GetPolicies", b"", token),
            lambda token: _grpc_web(port, "GetPolicies", b"", token),
        ]
        answers: list[Answer] = []
        for i, call in enumerate(calls):  # one subject per transport: its own bucket
            token = deployment.token(f"device-{i}")
            assert call(token)[0] == "OK"
            answers.append(call(token))
        _same(answers, "RESOURCE_EXHAUSTED", True)
    finally:
        running.stop(1.0)


def _held(running: RunningCollector, until: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not until():
        assert time.monotonic() < deadline, "the stalled call was not admitted"
        time.sleep(0.02)


def test_overload_and_share_refusals_share_admission(
    deployment: Deployment, sqlite_url: str, now: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC call withholding its body holds the only RPC slot (then a subject's
    share): web calls are refused exactly as gRPC calls are. (The asyncio server
    answers a share refusal after its hint: the base is scaled down to 20 ms here,
    as in test_stalled_bodies.py, so the three refusals' growing hints stay short.)"""
    from fedldp.collector import admission as adm

    monkeypatch.setattr(adm, "RETRY_AFTER_MS", 20)
    running = _start(
        deployment, sqlite_url, max_concurrent_rpcs=1, body_timeout_ms=30_000, server="asyncio"
    )
    staller = deployment.token("staller")
    body = _submit(deployment, now)
    admission: Admission | None = running.admission
    assert admission is not None
    slots = admission
    attack = StalledBodies(running.address, bearer_metadata(staller), calls=1, connections=1)
    try:
        attack.start()
        _held(running, lambda: slots.rpcs == 1)
        _same(_all(running, "Submit", body, deployment.token("honest")), "RESOURCE_EXHAUSTED", True)
    finally:
        attack.stop()
        running.stop(1.0)
    running = _start(
        deployment,
        sqlite_url,
        max_subject_inflight_bytes=CollectorConfig.max_message_bytes,  # one call fills it
        body_timeout_ms=30_000,
    )
    admission = running.admission
    assert admission is not None
    shares = admission
    attack = StalledBodies(running.address, bearer_metadata(staller), calls=1, connections=1)
    try:
        attack.start()
        _held(running, lambda: shares.held_by("staller") > 0)
        answers = _all(running, "Submit", body, staller)
        _same(answers, "RESOURCE_EXHAUSTED", True)
        assert "share of request bytes" in answers[0][1]
    finally:
        attack.stop()
        running.stop(1.0)


def test_body_deadline_refusal(deployment: Deployment, sqlite_url: str, now: int) -> None:
    """A web request whose body stops coming is refused after body_timeout_ms with
    the servicer's own message and hint, and holds nothing afterwards."""
    running = _start(deployment, sqlite_url, body_timeout_ms=300)
    try:
        assert running.web_port is not None
        conn = http.client.HTTPConnection("127.0.0.1", running.web_port, timeout=30)
        conn.putrequest("POST", "/fedldp.v1.Collector/Submit")
        for key, value in {
            "content-type": "application/proto",
            "content-length": "100",
            **_auth(deployment.token("slow")),
        }.items():
            conn.putheader(key, value)
        conn.endheaders()
        conn.send(b"\x0a")  # 1 of the 100 bytes promised, then nothing
        response = conn.getresponse()
        error = json.loads(response.read())
        conn.close()
        assert response.status == 429 or response.status >= 400
        assert error["code"] == "resource_exhausted"
        assert "did not arrive within 0.3 s" in error["message"]
        assert response.getheader("trailer-retry-after-ms") is not None
        assert running.admission is not None and running.admission.bytes == 0
    finally:
        running.stop(1.0)


def test_refused_before_the_body_is_read(deployment: Deployment, sqlite_url: str) -> None:
    """An unauthenticated request that promises 1 MiB and sends none of it is
    answered UNAUTHENTICATED at once (not after body_timeout_ms: nothing is read
    before admission) and holds nothing."""
    running = _start(deployment, sqlite_url, body_timeout_ms=60_000)
    try:
        assert running.web_port is not None
        conn = http.client.HTTPConnection("127.0.0.1", running.web_port, timeout=20)
        conn.putrequest("POST", "/fedldp.v1.Collector/Submit")
        conn.putheader("content-type", "application/proto")
        conn.putheader("content-length", str(1 << 20))
        conn.endheaders()  # and no body at all
        response = conn.getresponse()
        assert json.loads(response.read())["code"] == "unauthenticated"
        conn.close()
        assert running.admission is not None
        assert (running.admission.bytes, running.admission.rpcs) == (0, 0)
    finally:
        running.stop(1.0)


def test_one_reservation_per_web_call(deployment: Deployment, sqlite_url: str, now: int) -> None:
    """A chunked gRPC-Web Submit (no Content-Length: the gate reserves
    max_message_bytes) is served when the subject's share is exactly
    max_message_bytes: the handler takes the gate's reservation rather than a
    second one (which would not fit), and everything is given back afterwards."""
    running = _start(deployment, sqlite_url, max_subject_inflight_bytes=1 << 20)
    try:
        assert running.web_port is not None
        body = _submit(deployment, now)
        framed = b"\0" + struct.pack(">I", len(body)) + body
        conn = http.client.HTTPConnection("127.0.0.1", running.web_port, timeout=20)
        headers = {"content-type": "application/grpc-web+proto", **_auth(deployment.token("c"))}
        conn.request(
            "POST", "/fedldp.v1.Collector/Submit", iter([framed]), headers, encode_chunked=True
        )
        response = conn.getresponse()
        data = response.read()
        conn.close()
        assert response.status == 200 and data[0] == 0, data
        message = data[5 : 5 + struct.unpack(">I", data[1:5])[0]]
        assert pb.SubmitResponse.FromString(message).outcomes[0].outcome == pb.OUTCOME_ACCEPTED
        assert running.admission is not None
        assert (running.admission.bytes, running.admission.rpcs) == (0, 0)
    finally:
        running.stop(1.0)


def test_cors_and_gates(web: RunningCollector, deployment: Deployment) -> None:
    assert web.web_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", web.web_port, timeout=30)
    conn.request(
        "OPTIONS",
        "/fedldp.v1.Collector/Submit",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type,connect-protocol-version",
        },
    )
    preflight = conn.getresponse()
    preflight.read()
    conn.close()
    assert preflight.status == 200
    assert preflight.getheader("access-control-allow-origin") == ORIGIN
    assert "authorization" in (preflight.getheader("access-control-allow-headers") or "")
    token = deployment.token("device-1")
    headers = {"content-type": "application/proto", **_auth(token)}
    status, answer_headers, _ = _post(
        web.web_port, "GetPolicies", b"", {**headers, "origin": ORIGIN}
    )
    assert status == 200 and answer_headers["access-control-allow-origin"] == ORIGIN
    assert "retry-after-ms" in answer_headers["access-control-expose-headers"]
    status, _, _ = _post(
        web.web_port, "GetPolicies", b"", {**headers, "origin": "https://evil.example"}
    )
    assert status == 403
    status, _, _ = _post(
        web.web_port, "GetPolicies", b"{}", {**headers, "content-type": "application/json"}
    )
    assert status == 415


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"server": "sync"}, "web_listen needs server = asyncio"),
        ({"mtls": True, "tls_cert": "c", "tls_key": "k", "tls_client_ca": "a"}, "no mtls"),
        ({"web_listen": "nowhere"}, "web_listen:"),
    ],
)
def test_config_checks(overrides: dict[str, Any], problem: str) -> None:
    values: dict[str, Any] = {"ledger_url": "sqlite:////tmp/x.db", "web_listen": "127.0.0.1:0"}
    with pytest.raises(ConfigError, match=problem):
        CollectorConfig(**{**values, **overrides}).validate()


@pytest.mark.slow  # two collector processes start (about 10 s unloaded); the process model needs it
def test_two_processes_share_the_web_port(deployment: Deployment, tmp_path: Path, now: int) -> None:
    """`fedldp collector serve` with 2 processes: the supervisor reserves one web
    port for both, writes it to PORT_FILE.web, and web calls are served."""
    config = write_config(
        deployment,
        tmp_path,
        f"sqlite:///{tmp_path / 'ledger.db'}",
        "web2",
        processes=2,
        web_listen="127.0.0.1:0",
        web_allowed_origins=[ORIGIN],
    )
    proc = spawn(config, "web2")
    try:
        web_port = int((tmp_path / "web2.port.web").read_text())
        token = deployment.token("device-1")
        for _ in range(4):  # new connections: the kernel spreads them over both
            assert _connect(web_port, "Submit", _submit(deployment, now), token)[0] == "OK"
        assert _grpc(proc.address, "GetPolicies", b"", token)[0] == "OK"
    finally:
        proc.proc.terminate()
        proc.proc.wait(timeout=60)


def test_http2_grpc_on_the_web_port(web: RunningCollector, deployment: Deployment) -> None:
    """The web port speaks HTTP/2 too (h2c here; ALPN with TLS): a plain gRPC client
    (HTTP/2 with trailers) is served there, with the same refusals."""
    address = f"127.0.0.1:{web.web_port}"
    token = deployment.token("device-1")
    assert _grpc(address, "GetPolicies", b"", token)[0] == "OK"
    assert _grpc(address, "GetPolicies", b"", None) == _grpc(web.address, "GetPolicies", b"", None)
