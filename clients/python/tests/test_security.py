"""Token auth, TLS and rate limits against the real server, surfacing as typed errors."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ALICE, Server
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from countersign import (
    Approval,
    AsyncClient,
    Client,
    PermissionDenied,
    RateLimited,
    State,
    Unauthenticated,
    Unavailable,
)

AGENT_TOKEN = "agent-token-0123456789"
WORKER_TOKEN = "worker-token-0123456789"

TOKENS = """
[[tokens]]
name = "coder"
role = "agent"
agents = ["coder-1"]
value_env = "TEST_AGENT_TOKEN"

[[tokens]]
name = "worker"
role = "worker"
channels = ["*"]
value_env = "TEST_WORKER_TOKEN"
"""


@pytest.fixture(scope="module")
def token_server(start_server: Callable[..., Server]) -> Server:
    return start_server(TOKENS, env={"TEST_AGENT_TOKEN": AGENT_TOKEN, "TEST_WORKER_TOKEN": WORKER_TOKEN})


def test_a_valid_token_is_accepted_and_scoped_to_its_agents(token_server: Server) -> None:
    with token_server.client(token=AGENT_TOKEN) as agent, token_server.client(token=WORKER_TOKEN) as worker:
        approval = agent.request_approval(agent_id="coder-1", tool_name="bash").approval
        assert agent.get(approval.id).state is State.PENDING
        with pytest.raises(PermissionDenied, match="other-agent"):
            agent.request_approval(agent_id="other-agent", tool_name="bash")
        with pytest.raises(PermissionDenied):
            agent.decide(approval.id, "approve", decider=ALICE)
        assert worker.decide(approval.id, "approve", decider=ALICE).approval.approved


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789"])
def test_a_missing_or_wrong_token_is_unauthenticated(token_server: Server, token: str | None) -> None:
    with token_server.client(token=token) as client:
        with pytest.raises(Unauthenticated) as refused:
            client.request_approval(agent_id="coder-1", tool_name="bash")
        assert refused.value.message
        # A watch cannot fix this by retrying: it raises, and again when iterated again.
        watch = client.watch(max_backoff=0.1)
        for _ in range(2):
            with pytest.raises(Unauthenticated):
                next(watch)
        watch.close()


def test_over_the_rate_limit_says_when_to_retry(start_server: Callable[..., Server]) -> None:
    server = start_server(limits={"requests_per_minute": 1, "request_burst": 1})
    with server.client() as client:
        client.request_approval(agent_id="fast", tool_name="bash")
        with pytest.raises(RateLimited) as limited:
            client.request_approval(agent_id="fast", tool_name="bash")
        assert 0 < limited.value.retry_after <= 60
        assert "requests_per_minute" in limited.value.message


def test_request_and_wait_waits_out_a_rate_limit(start_server: Callable[..., Server]) -> None:
    # One call at once, then one every 2 s: the second waits for the retry-after, then is asked.
    server = start_server(limits={"requests_per_minute": 30, "request_burst": 1})
    with server.client() as client:
        client.request_approval(agent_id="fast", tool_name="bash")
        approval = client.request_and_wait(agent_id="fast", tool_name="bash", deadline=5.0)
        assert approval.pending, "requested once the limit allowed it, and nobody decided"


def test_the_async_request_and_wait_waits_out_a_rate_limit(start_server: Callable[..., Server]) -> None:
    server = start_server(limits={"requests_per_minute": 30, "request_burst": 1})

    async def scenario() -> Approval:
        async with AsyncClient(server.address) as client:
            await client.request_approval(agent_id="fast", tool_name="bash")
            return await client.request_and_wait(agent_id="fast", tool_name="bash", deadline=5.0)

    assert asyncio.run(scenario()).pending


def certificate(subject: str, issuer_key, public_key, issuer: x509.Name | None, ca: bool) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate it signs for 127.0.0.1 and localhost."""
    directory = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate("countersign test CA", ca_key, ca_key.public_key(), None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = certificate(
        "countersign test server", ca_key, server_key.public_key(), ca.subject, ca=False
    )
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server_cert.public_bytes(pem))
    paths[2].write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def test_tls_with_the_ca_file(
    start_server: Callable[..., Server], tls_files: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_files
    server = start_server(tls={"cert_file": str(cert), "key_file": str(key)})
    with Client(f"https://{server.address}", ca_file=ca) as client:
        approval = client.request_approval(agent_id="tls-agent", tool_name="bash").approval
        assert client.get(approval.id).id == approval.id
    with Client(server.address, ca_file=ca) as client:
        assert client.list(agent_id="tls-agent").approvals[0].id == approval.id
    # Plaintext to a TLS server, or TLS without the CA, never gets through.
    with Client(server.address, timeout=2) as plaintext, pytest.raises(Unavailable):
        plaintext.get(approval.id)
    with Client(f"https://{server.address}", timeout=2) as unverified, pytest.raises(Unavailable):
        unverified.get(approval.id)
