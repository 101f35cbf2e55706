"""OpenID CIBA (poll mode), conformance-style, against the real server binary over HTTP on
both storage backends: discovery; client authentication with a standard OAuth client
(authlib: client_secret_basic and private_key_jwt with EdDSA and ES256) and its refusals (a
wrong secret, an unknown client, a replayed assertion); an approval asked at /bc-authorize
and redeemed at the token endpoint for tokens verified against the JWKS (joserfc), carrying
the approved or the edited call; rejection, expiry, fast polling and malformed
authorization_details, each answered as CIBA Core 1.0, RFC 6749 and RFC 9396 say."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session, OAuthError
from authlib.oauth2.rfc7523 import PrivateKeyJWT
from conftest import ALICE, Server, free_port
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OKPKey

from countersign import Client, State, Verdict

# The server signs its tokens with "EdDSA" (as its receipts), which joserfc flags since RFC 9864.
pytestmark = pytest.mark.filterwarnings("ignore:EdDSA is deprecated")

CIBA_GRANT = "urn:openid:params:grant-type:ciba"
SECRET = "basic-secret-0123456789abcdef"
AGENT = "agent-ciba"

CONFIG = """
[[http.clients]]
client_id = "basic-app"
agent = "agent-ciba"
secret_env = "CIBA_TEST_SECRET"

[[http.clients]]
client_id = "jwt-app"
agent = "agent-ciba"
jwks = '''{jwks}'''

[[approvers]]
id = "alice"
max_risk = "critical"
identities = {{ cli = ["alice"] }}

[[groups]]
name = "ops"
members = ["alice"]

[[rules]]
name = "reads-are-fine"
action = "allow"
[rules.match]
tool = "read_file"
"""

ED25519 = OKPKey.generate_key("Ed25519", parameters={"kid": "ed"})
P256 = ECKey.generate_key("P-256", parameters={"kid": "ec"})


class Provider:
    """The server's [http] listener as an OpenID provider, and a gRPC client to decide."""

    def __init__(self, server: Server, port: int) -> None:
        self.server = server
        self.issuer = f"http://127.0.0.1:{port}"
        self.metadata: dict[str, Any] = requests.get(
            f"{self.issuer}/.well-known/openid-configuration", timeout=10
        ).json()
        self.token_endpoint: str = self.metadata["token_endpoint"]
        self.authorize_endpoint: str = self.metadata["backchannel_authentication_endpoint"]

    def session(self, client_id: str, secret: object, method: str = "client_secret_basic") -> OAuth2Session:
        session = OAuth2Session(client_id, secret, token_endpoint_auth_method=method)
        if method == "private_key_jwt":
            alg = "EdDSA" if isinstance(secret, OKPKey) else "ES256"
            session.register_client_auth_method(PrivateKeyJWT(alg=alg))
        return session

    def ask(self, session: OAuth2Session, **params: str) -> requests.Response:
        """POST /bc-authorize, the client authenticated as at the token endpoint."""
        return session.post(
            self.authorize_endpoint,
            data=params,
            auth=session.client_auth(session.token_endpoint_auth_method),
            timeout=10,
        )

    def poll(self, session: OAuth2Session, auth_req_id: str) -> dict[str, Any]:
        return session.fetch_token(self.token_endpoint, grant_type=CIBA_GRANT, auth_req_id=auth_req_id)

    def keys(self) -> KeySet:
        return KeySet.import_key_set(requests.get(self.metadata["jwks_uri"], timeout=10).json())


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def provider(request: pytest.FixtureRequest, start_server: Callable[..., Server]) -> Iterator[Provider]:
    database = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    port = free_port()
    jwks = json.dumps({"keys": [ED25519.as_dict(private=False), P256.as_dict(private=False)]})
    server = start_server(
        CONFIG.format(jwks=jwks),
        env={"CIBA_TEST_SECRET": SECRET},
        database=database,
        http={"listen": f"127.0.0.1:{port}", "poll_interval_seconds": 30},
    )
    yield Provider(server, port)
    server.kill()


def tool_call(tool: str = "deploy", **arguments: object) -> str:
    return json.dumps(
        [{"type": "countersign_tool_call", "tool": tool, "arguments": arguments, "risk": "high"}]
    )


def asked(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    answer = response.json()
    assert answer["interval"] == 30
    assert answer["expires_in"] > 0
    return answer["auth_req_id"]


def approval_id(auth_req_id: str) -> str:
    return auth_req_id.rsplit(".", 1)[0]


def refused(call: Callable[[], object]) -> OAuthError:
    with pytest.raises(OAuthError) as error:
        call()
    return error.value


def test_discovery_has_the_ciba_metadata(provider: Provider) -> None:
    metadata = provider.metadata
    assert metadata["issuer"] == provider.issuer
    assert metadata["backchannel_authentication_endpoint"] == provider.issuer + "/bc-authorize"
    assert metadata["backchannel_token_delivery_modes_supported"] == ["poll"]
    assert metadata["backchannel_user_code_parameter_supported"] is False
    assert CIBA_GRANT in metadata["grant_types_supported"]
    assert set(metadata["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic",
        "private_key_jwt",
    }
    assert {"EdDSA", "ES256"} <= set(metadata["token_endpoint_auth_signing_alg_values_supported"])
    assert metadata["authorization_details_types_supported"] == ["countersign_tool_call"]
    assert metadata["id_token_signing_alg_values_supported"] == ["EdDSA"]
    assert provider.keys().keys, "the JWKS has the signing key"


def test_approve_then_tokens_carry_the_edited_call(provider: Provider) -> None:
    session = provider.session("basic-app", SECRET)
    auth_req_id = asked(
        provider.ask(
            session,
            scope="openid",
            login_hint="ops",
            binding_message="Deploy K9Q2",
            authorization_details=tool_call(env="staging", version="1.2"),
        )
    )
    with Client(provider.server.address) as grpc:
        approval = grpc.get(approval_id(auth_req_id))
        assert approval.action == "Deploy K9Q2"
        assert approval.agent_id == AGENT
        grpc.decide(
            approval.id, Verdict.APPROVE, decider=ALICE, edited_arguments={"env": "staging", "version": "1.3"}
        )

    tokens = provider.poll(session, auth_req_id)
    keys = provider.keys()
    access = jwt.decode(tokens["access_token"], keys, algorithms=["EdDSA"])
    assert access.header["typ"] == "at+jwt"
    assert access.claims["sub"] == "alice"
    assert access.claims["client_id"] == "basic-app"
    details = access.claims["authorization_details"]
    assert details[0]["type"] == "countersign_tool_call"
    assert details[0]["arguments"] == {"env": "staging", "version": "1.3"}
    assert tokens["authorization_details"] == details
    receipt = jwt.decode(access.claims["receipt"], keys, algorithms=["EdDSA"])
    assert receipt.claims["approval_id"] == approval_id(auth_req_id)

    id_token = jwt.decode(tokens["id_token"], keys, algorithms=["EdDSA"])
    claims = id_token.claims
    assert claims["iss"] == provider.issuer
    assert claims["aud"] == "basic-app"
    assert claims["sub"] == "alice"
    assert claims["urn:openid:params:jwt:claim:auth_req_id"] == auth_req_id
    assert claims["exp"] > claims["iat"] >= claims["auth_time"] - 1

    # The tokens are issued once.
    assert refused(lambda: provider.poll(session, auth_req_id)).error == "invalid_grant"


@pytest.mark.parametrize("key", [ED25519, P256], ids=["EdDSA", "ES256"])
def test_private_key_jwt_authenticates_and_a_replayed_jti_is_refused(provider: Provider, key: object) -> None:
    session = provider.session("jwt-app", key, "private_key_jwt")
    # A call the policy allows: approved at once, so the first poll has the tokens.
    auth_req_id = asked(provider.ask(session, authorization_details=tool_call("read_file", path="README")))
    tokens = provider.poll(session, auth_req_id)
    access = jwt.decode(tokens["access_token"], provider.keys(), algorithms=["EdDSA"])
    assert access.claims["sub"] == "rule:reads-are-fine"
    assert "id_token" not in tokens, "no openid scope, no ID token"

    # The same assertion (its jti) a second time.
    sent: list[requests.PreparedRequest] = []
    session.hooks["response"].append(lambda response, **_: sent.append(response.request))
    asked(provider.ask(session, authorization_details=tool_call()))
    replay = requests.post(
        provider.authorize_endpoint,
        data=sent[-1].body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert replay.status_code == 401
    assert replay.json()["error"] == "invalid_client"
    assert "jti" in replay.json()["error_description"]


@pytest.mark.parametrize(
    ("client_id", "secret"),
    [("basic-app", "wrong-secret-0123456789"), ("nobody", SECRET)],
    ids=["wrong secret", "unknown client"],
)
def test_a_client_that_does_not_authenticate_is_invalid_client(
    provider: Provider, client_id: str, secret: str
) -> None:
    session = provider.session(client_id, secret)
    response = provider.ask(session, authorization_details=tool_call())
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"
    assert response.headers["WWW-Authenticate"].startswith("Basic")
    assert refused(lambda: provider.poll(session, "x.y")).error == "invalid_client"


def test_reject_is_access_denied_and_expiry_is_expired_token(provider: Provider) -> None:
    session = provider.session("basic-app", SECRET)
    rejected = asked(provider.ask(session, authorization_details=tool_call(env="prod")))
    expiring = asked(provider.ask(session, authorization_details=tool_call(), requested_expiry="1"))
    with Client(provider.server.address) as grpc:
        grpc.decide(approval_id(rejected), Verdict.REJECT, decider=ALICE, reason="not today")
        assert grpc.wait_for_decision(approval_id(expiring), timeout=20).state == State.EXPIRED
    denied = refused(lambda: provider.poll(session, rejected))
    assert denied.error == "access_denied"
    assert "not today" in (denied.description or "")
    assert refused(lambda: provider.poll(session, expiring)).error == "expired_token"


def test_polling_faster_than_the_interval_is_slow_down(provider: Provider) -> None:
    session = provider.session("basic-app", SECRET)
    auth_req_id = asked(provider.ask(session, authorization_details=tool_call()))
    assert refused(lambda: provider.poll(session, auth_req_id)).error == "authorization_pending"
    # The interval is 30 s; the next poll comes at once.
    assert refused(lambda: provider.poll(session, auth_req_id)).error == "slow_down"


def test_another_clients_or_an_unknown_auth_req_id_is_invalid_grant(provider: Provider) -> None:
    basic = provider.session("basic-app", SECRET)
    auth_req_id = asked(provider.ask(basic, authorization_details=tool_call()))
    other = provider.session("jwt-app", ED25519, "private_key_jwt")
    assert refused(lambda: provider.poll(other, auth_req_id)).error == "invalid_grant"
    unknown = f"{uuid.uuid4()}.{auth_req_id.rsplit('.', 1)[1]}"
    assert refused(lambda: provider.poll(basic, unknown)).error == "invalid_grant"
    wrong_grant = refused(lambda: basic.fetch_token(provider.token_endpoint, grant_type="client_credentials"))
    assert wrong_grant.error == "unsupported_grant_type"


@pytest.mark.parametrize(
    ("details", "error", "field"),
    [
        ("not json", "invalid_request", "authorization_details:"),
        ('{"type": "countersign_tool_call"}', "invalid_request", "authorization_details:"),
        (
            '[{"type": "countersign_tool_call"}]',
            "invalid_authorization_details",
            "authorization_details[0].tool:",
        ),
        (
            '[{"type": "payment_initiation"}]',
            "invalid_authorization_details",
            "authorization_details[0].type:",
        ),
        (
            '[{"type": "countersign_tool_call", "tool": "x", "arguments": [1]}]',
            "invalid_authorization_details",
            "authorization_details[0].arguments:",
        ),
    ],
)
def test_malformed_authorization_details_are_refused_naming_the_field(
    provider: Provider, details: str, error: str, field: str
) -> None:
    response = provider.ask(provider.session("basic-app", SECRET), authorization_details=details)
    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == error
    assert answer["error_description"].startswith(field)


def test_an_authzen_evaluation_that_needs_a_person_names_the_ciba_request(provider: Provider) -> None:
    evaluation = {
        "subject": {"type": "agent", "id": AGENT},
        "resource": {
            "type": "tool",
            "id": "deploy",
            "properties": {"arguments": {"env": "prod"}, "risk": "high"},
        },
        "action": {"name": "deploy"},
    }
    answer = requests.post(f"{provider.issuer}/access/v1/evaluation", json=evaluation, timeout=10).json()
    assert answer["decision"] is False
    ciba = answer["context"]["ask"]["ciba"]
    assert ciba["backchannel_authentication_endpoint"] == provider.authorize_endpoint
    # What the evaluation names is what /bc-authorize takes.
    session = provider.session("basic-app", SECRET)
    asked(provider.ask(session, authorization_details=json.dumps(ciba["authorization_details"])))
