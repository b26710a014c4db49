"""A bearer token (TLS) against a plaintext collector: the error says to check TLS."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from fedldp.client.transport import Credentials, Transport, TransportError

from fedldp.cli_errors import describe


def test_tls_client_against_plaintext_server_gets_a_tls_hint() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        transport = Transport(f"127.0.0.1:{port}", Credentials.bearer("token"), timeout_seconds=10)
        try:
            with pytest.raises(TransportError) as caught:
                transport.get_policies()
        finally:
            transport.close()
    finally:
        server.stop(None)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert "TLS handshake failed" in str(caught.value)
    failure = describe(caught.value)
    assert failure.exit_code == 1 and "tls_cert" in failure.message
