"""The whole Session path over TLS: HAProxy terminates TLS (certificate from a CA made here) in
front of Serve's gRPC ingress, and the device SDK connects with tls=True and that CA."""

from __future__ import annotations

import grpc
import pytest
from helpers import PROMPTS, free_port, reference_greedy
from helpers.tls import make_ca_and_server_cert

from edgespec.cloud.serving.tls import TlsTerminator, render_config
from edgespec.edge.client import EdgeClient
from edgespec.edge.errors import ConnectionFailedError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls(server, tmp_path_factory):
    certs = make_ca_and_server_cert(tmp_path_factory.mktemp("certs"))
    with TlsTerminator(certs["cert"], certs["key"], upstream=server.address, listen_port=free_port(),
                       listen_host="127.0.0.1") as terminator:
        yield terminator, certs


def test_the_session_path_over_tls_equals_the_target(server, tls, target_model):
    terminator, certs = tls
    with EdgeClient(terminator.address, server.pair.draft_dir, tls=True, ca_cert=certs["ca"]) as client:
        for prompt in PROMPTS[:3]:
            ids = client.encode(prompt)
            result = client.generate(ids, max_new_tokens=24, k=3, stop_token_ids=())
            assert result.token_ids == reference_greedy(target_model, ids, 24)
            cloud = client.generate_cloud(ids, max_new_tokens=8, stop_token_ids=())
            assert cloud.token_ids == reference_greedy(target_model, ids, 8)


def test_a_certificate_from_another_ca_is_refused(server, tls):
    terminator, certs = tls
    with EdgeClient(terminator.address, server.pair.draft_dir, tls=True, ca_cert=certs["other_ca"], max_retries=0,
                    timeout=10) as client:
        with pytest.raises(ConnectionFailedError):
            client.info()


def test_plaintext_to_the_tls_port_gets_nowhere(server, tls):
    terminator, _ = tls
    with grpc.insecure_channel(terminator.address) as channel:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with pytest.raises(grpc.RpcError) as caught:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_ca_cert_without_tls_is_a_mistake(server, tls):
    _, certs = tls
    with pytest.raises(ValueError, match="tls=True"):
        EdgeClient(server.address, server.pair.draft_dir, ca_cert=certs["ca"])


def test_the_rendered_configuration_terminates_tls_with_h2():
    text = render_config(listen="0.0.0.0:443", pem="/etc/edgespec/server.pem", upstream="127.0.0.1:9000")
    assert "bind 0.0.0.0:443 ssl crt /etc/edgespec/server.pem alpn h2" in text
    assert "server ingress 127.0.0.1:9000" in text and "mode tcp" in text
