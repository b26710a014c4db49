"""Attack on the web endpoint's refusals (docs/collector.md, "Web endpoint"):
malformed gRPC-Web frames, bad protocol headers, compressed bodies, unknown
methods, other origins. Each must get a clear refusal that charges nothing, never
an HTTP 500 or gRPC INTERNAL/UNKNOWN, and the same status as over gRPC."""

from __future__ import annotations

import gzip
import http.client
import secrets
import struct
import time
from collections.abc import Iterator

import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb

pytest.importorskip("connectrpc", reason="the web extra (connect-python) is not installed")
pytest.importorskip("hypercorn", reason="the web extra (hypercorn) is not installed")

ORIGIN = "https://app.example"
SUBMIT = "/fedldp.v1.Collector/Submit"
GRPC_WEB = "application/grpc-web+proto"
Response = tuple[int, dict[str, str], bytes]


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    d = Deployment.create(now=int(time.time()))
    d.add_categorical("color", labels=("red", "green", "blue", "other"))
    return d


@pytest.fixture(scope="module")
def web(
    deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCollector]:
    url = f"sqlite:///{tmp_path_factory.mktemp('webref') / 'ledger.db'}"
    config = deployment.config(url, web_listen="127.0.0.1:0", web_allowed_origins=(ORIGIN,))
    running = start_collector(config, registry=deployment.registry())
    yield running
    running.stop(1.0)


def _post(web: RunningCollector, path: str, body: bytes, headers: dict[str, str]) -> Response:
    assert web.web_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", web.web_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _grpc_status(response: Response) -> int:
    """grpc-status of a gRPC-Web answer (headers, else the trailer frame)."""
    status, headers, data = response
    assert status == 200, response
    if "grpc-status" in headers:
        return int(headers["grpc-status"])
    while data:
        flag, size = data[0], struct.unpack(">I", data[1:5])[0]
        if flag & 0x80:
            for line in data[5 : 5 + size].decode().split("\r\n"):
                if line.lower().startswith("grpc-status:"):
                    return int(line.split(":", 1)[1])
        data = data[5 + size :]
    raise AssertionError(f"no grpc-status in {response!r}")


def _token(deployment: Deployment) -> dict[str, str]:
    return {"authorization": f"Bearer {deployment.token('device-' + secrets.token_hex(4))}"}


def _submit(deployment: Deployment) -> bytes:
    policy = deployment.verified(deployment.envelopes[0])
    report = make_report(policy, CategoryOutput(1), coarse_time=coarse(int(time.time())))
    return pb.SubmitRequest(reports=[report]).SerializeToString()


def _accepted(web: RunningCollector) -> float:
    value = web.metrics.registry.get_sample_value(
        "fedldp_collector_requests_total", {"method": "Submit", "code": "OK"}
    )
    return value or 0.0


INVALID_ARGUMENT, UNIMPLEMENTED, INTERNAL, UNKNOWN = 3, 12, 13, 2


def test_bad_grpc_timeout_is_not_http_500(web: RunningCollector, deployment: Deployment) -> None:
    headers = {"content-type": GRPC_WEB, "grpc-timeout": "zzz", **_token(deployment)}
    status, _, _ = _post(web, SUBMIT, b"\0\0\0\0\0", headers)
    assert status != 500


def test_compressed_flag_without_encoding_is_not_internal(
    web: RunningCollector, deployment: Deployment
) -> None:
    headers = {"content-type": GRPC_WEB, **_token(deployment)}
    code = _grpc_status(_post(web, SUBMIT, b"\x01\0\0\0\x03abc", headers))
    assert code not in (INTERNAL, UNKNOWN)


@pytest.mark.parametrize("body", [b"", b"\0\0\0", b"\0\0\0\0\x10abc", b"\0\xff\xff\xff\xff"])
def test_truncated_grpc_web_frame_is_invalid_argument(
    web: RunningCollector, deployment: Deployment, body: bytes
) -> None:
    headers = {"content-type": GRPC_WEB, **_token(deployment)}
    assert _grpc_status(_post(web, SUBMIT, body, headers)) == INVALID_ARGUMENT


def test_trailer_frame_is_not_a_request(web: RunningCollector, deployment: Deployment) -> None:
    headers = {"content-type": GRPC_WEB, **_token(deployment)}
    assert _grpc_status(_post(web, SUBMIT, b"\x80\0\0\0\0", headers)) != 0


# --- what held ---


def test_gzip_bomb_refused_unread(web: RunningCollector, deployment: Deployment) -> None:
    """Content-Encoding gzip: refused (unimplemented), never decompressed, nothing charged."""
    before = _accepted(web)
    bomb = gzip.compress(_submit(deployment) * 20000)
    headers = {
        "content-type": "application/proto",
        "content-encoding": "gzip",
        **_token(deployment),
    }
    status, _, data = _post(web, SUBMIT, bomb, headers)
    assert status == 501 and b"unimplemented" in data
    headers = {"content-type": GRPC_WEB, "grpc-encoding": "gzip", **_token(deployment)}
    framed = b"\x01" + struct.pack(">I", len(bomb)) + bomb
    assert _grpc_status(_post(web, SUBMIT, framed, headers)) == UNIMPLEMENTED
    assert _accepted(web) == before


@pytest.mark.parametrize(
    ("path", "content_type", "status"),
    [
        ("/fedldp.v1.Collector/Nope", "application/proto", 404),
        ("/x.Y/Z", "application/proto", 404),
        (SUBMIT, "application/json", 415),
        (SUBMIT, "text/plain", 415),
    ],
)
def test_unknown_methods_and_types_refused(
    web: RunningCollector, deployment: Deployment, path: str, content_type: str, status: int
) -> None:
    before = _accepted(web)
    answer = _post(
        web, path, _submit(deployment), {"content-type": content_type, **_token(deployment)}
    )
    assert answer[0] == status
    assert _accepted(web) == before


@pytest.mark.parametrize(
    "origin", ["null", "https://app.example.evil", "https://APP.example", ORIGIN + "/"]
)
def test_other_origins_refused_and_charge_nothing(
    web: RunningCollector, deployment: Deployment, origin: str
) -> None:
    before = _accepted(web)
    headers = {"content-type": "application/proto", "origin": origin, **_token(deployment)}
    assert _post(web, SUBMIT, _submit(deployment), headers)[0] == 403
    assert _accepted(web) == before


def _grpc_submit(web: RunningCollector, body: bytes, headers: dict[str, str]) -> pb.SubmitResponse:
    import grpc

    with grpc.insecure_channel(web.address) as channel:
        call = channel.unary_unary(
            SUBMIT, request_serializer=None, response_deserializer=pb.SubmitResponse.FromString
        )
        metadata = tuple((k, v) for k, v in headers.items())
        answer: pb.SubmitResponse = call(body, metadata=metadata, timeout=20)
        return answer


@pytest.mark.parametrize("content_type", ["application/proto", GRPC_WEB])
def test_grpc_first_then_web_is_duplicate_and_conflict(
    web: RunningCollector, deployment: Deployment, content_type: str
) -> None:
    """Accepted over gRPC, then the same bytes over the web: DUPLICATE (charged once);
    the same id with other content over the web: CONFLICT; from another subject: CONFLICT."""
    token = _token(deployment)
    policy = deployment.verified(deployment.envelopes[0])
    report_id = secrets.token_bytes(16)

    def body(category: int) -> bytes:
        report = make_report(
            policy,
            CategoryOutput(category),
            coarse_time=coarse(int(time.time())),
            report_id=report_id,
        )
        return pb.SubmitRequest(reports=[report]).SerializeToString()

    assert _grpc_submit(web, body(1), token).outcomes[0].outcome == pb.OUTCOME_ACCEPTED

    def web_outcome(data: bytes, headers: dict[str, str]) -> int:
        framed = content_type == GRPC_WEB
        sent = b"\0" + struct.pack(">I", len(data)) + data if framed else data
        status, _, answer = _post(web, SUBMIT, sent, {"content-type": content_type, **headers})
        assert status == 200
        message = answer[5 : 5 + struct.unpack(">I", answer[1:5])[0]] if framed else answer
        return pb.SubmitResponse.FromString(message).outcomes[0].outcome

    assert web_outcome(body(1), token) == pb.OUTCOME_DUPLICATE
    assert web_outcome(body(2), token) == pb.OUTCOME_CONFLICT
    assert web_outcome(body(1), _token(deployment)) == pb.OUTCOME_CONFLICT
