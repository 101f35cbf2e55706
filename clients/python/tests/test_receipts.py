"""Decision receipts (docs/security.md#decision-receipts): the arguments' digest computed here
is the server's, an approval is returned only with a receipt that verifies for the call
asked, altered receipts are refused, and a man in the middle cannot turn a rejection into an
approval."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading

import pytest
from conftest import ALICE, Approver, Server

from countersign import Client, ReceiptError, Scope, Verdict
from countersign.model import approval_of
from countersign.receipts import KeySet, args_digest, canonical_json, verify_receipt
from countersign.v1 import approval_pb2 as pb

# Texts whose canonical form is tricky: unicode (escaped and not, above U+FFFF, controls),
# numbers (fractions that are integers, exponents, -0, the 64-bit edges, the smallest double),
# nested keys whose code point order differs from UTF-16's.
TRICKY = [
    '{"note": "caf\\u00e9 \\ud83d\\ude80 \\u001f \\u007f \\"q\\" \\\\ /", "emoji": "🚀"}',
    '{"n": [1.0, 1e3, -0, -0.0, 1e21, 1e-7, 0.000001, 123456789012345678, 5e-324, 1.7976931348623157e308]}',
    '{"edges": [9223372036854775807, -9223372036854775808, 18446744073709551615, 0.1, 100.5e-2]}',
    '{"z": {"\\ue000": 1, "\\ud83d\\ude00": 2, "a": {"B": 1, "a": [], "": null}}, "A": true, "é": false}',
]


def raw_request(client: Client, agent_id: str, key: str, arguments_json: str):
    message = pb.RequestApprovalRequest(
        agent_id=agent_id,
        idempotency_key=key,
        tool_name="deploy",
        arguments_json=arguments_json,
        action="x",
        risk=pb.RISK_HIGH,
    )
    return approval_of(client._call("RequestApproval", message).approval)


@pytest.mark.parametrize("text", TRICKY)
def test_the_digest_computed_here_is_the_servers(client: Client, agent_id: str, text: str) -> None:
    approval = raw_request(client, agent_id, "call-1", text)
    assert args_digest(text) == approval.args_digest, canonical_json(json.loads(text))


def approved(server: Server, agent_id: str, key: str, **options: object):
    """request_and_wait, approved by Alice: the approval (its receipt verified) and the client."""
    client = server.client(**options)
    approver = Approver(server.address, agent_id, [(Verdict.APPROVE, Scope.ONCE, "ok")])
    approval = client.request_and_wait(
        agent_id=agent_id,
        tool_name="deploy",
        arguments={"env": "prod", "note": "café"},
        action="deploy",
        risk="high",
        idempotency_key=key,
        deadline=20,
    )
    approver.join()
    return approval, client


def test_an_approval_comes_back_only_with_a_receipt_that_verifies(server: Server, agent_id: str) -> None:
    pin = server.client().signing_keys()[1]
    approval, client = approved(server, agent_id, "call-1", receipt_pin=pin)
    assert approval.approved and approval.receipt
    claims = client.verify_receipt(approval, json.dumps({"env": "prod", "note": "café"}))
    assert claims["approval_id"] == approval.id
    assert claims["verdict"] == "APPROVE"
    assert claims["args_digest"] == approval.args_digest
    assert claims["deciders"][0]["user_id"] == ALICE.user_id


def test_a_client_pinned_to_another_key_set_refuses_the_approval(server: Server, agent_id: str) -> None:
    with pytest.raises(ReceiptError, match=r"the key set's fingerprint is .*, not the pinned kPrK_"):
        approved(server, agent_id, "call-1", receipt_pin="kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k")


def with_claim(receipt: str, name: str, value: str) -> str:
    header, payload, signature = receipt.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims[name] = value
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_altered_receipts_are_refused_naming_what_did_not_match(server: Server, agent_id: str) -> None:
    first, client = approved(server, agent_id, "call-1")
    second, _ = approved(server, agent_id, "call-2")
    keys = KeySet.from_jwks(client.signing_keys()[0])
    digest = first.args_digest
    verify_receipt(first.receipt, keys, approval_id=first.id, args_digest=digest)
    for name, value in [("args_digest", "0" * 64), ("verdict", "REJECT"), ("approval_id", second.id)]:
        with pytest.raises(ReceiptError, match="signature does not verify"):
            altered = with_claim(first.receipt, name, value)
            verify_receipt(altered, keys, approval_id=first.id, args_digest=digest)
    header, payload, signature = first.receipt.split(".")
    flipped = ("B" if signature[4] == "A" else "A").join([signature[:4], signature[5:]])
    with pytest.raises(ReceiptError, match="signature does not verify"):
        verify_receipt(f"{header}.{payload}.{flipped}", keys, approval_id=first.id, args_digest=digest)
    with pytest.raises(ReceiptError, match=f"is for approval {first.id}, not {second.id}"):
        verify_receipt(first.receipt, keys, approval_id=second.id, args_digest=digest)
    with pytest.raises(ReceiptError, match="approves arguments with digest"):
        verify_receipt(first.receipt, keys, approval_id=first.id, args_digest=args_digest({"env": "dev"}))
    with pytest.raises(ReceiptError, match="expired at"):
        verify_receipt(first.receipt, keys, approval_id=first.id, args_digest=digest, now=2**40)


class RewritingProxy:
    """A TCP proxy that passes the client's bytes and replaces ``old`` with ``new`` in the
    server's: a man in the middle of plaintext gRPC."""

    def __init__(self, target: str, old: bytes, new: bytes) -> None:
        self.target = target.rsplit(":", 1)
        self.old, self.new = old, new
        self.rewrites = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            inbound, _ = self.listener.accept()
            outbound = socket.create_connection((self.target[0], int(self.target[1])))
            threading.Thread(target=self._pipe, args=(inbound, outbound, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(outbound, inbound, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, rewrite: bool) -> None:
        try:
            while data := source.recv(65536):
                if rewrite and self.old in data:
                    self.rewrites += data.count(self.old)
                    data = data.replace(self.old, self.new)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


def test_a_rejection_a_man_in_the_middle_turned_into_an_approval_is_refused(
    server: Server, agent_id: str
) -> None:
    # Approval.state (field 15): REJECTED (3) becomes APPROVED (2).
    proxy = RewritingProxy(server.address, b"\x78\x03", b"\x78\x02")
    approver = Approver(server.address, agent_id, [(Verdict.REJECT, Scope.ONCE, "no")])
    with Client(proxy.address) as client, pytest.raises(ReceiptError, match="verdict is REJECT, not APPROVE"):
        client.request_and_wait(
            agent_id=agent_id,
            tool_name="deploy",
            arguments={"env": "prod"},
            action="deploy",
            risk="high",
            deadline=20,
        )
    approver.join()
    assert proxy.rewrites > 0


def test_a_rotation_keeps_old_receipts_verifiable(start_server, agent_id: str) -> None:
    server = start_server()
    old, client = approved(server, agent_id, "call-1")
    jwks, fingerprint = client.signing_keys()
    server.kill()
    rotated = subprocess.run(
        [
            str(server.binary),
            "--config",
            str(server.config),
            "--database",
            str(server.database),
            "keys",
            "rotate",
        ],
        capture_output=True,
        check=True,
    )
    assert json.loads(rotated.stdout)["retired_kid"] == fingerprint
    server.start()
    new, client = approved(server, agent_id, "call-2", receipt_pin=fingerprint)
    keys = KeySet.from_jwks(client.signing_keys()[0], fingerprint)
    assert len(keys.keys) == 2
    assert verify_receipt(old.receipt, keys)["approval_id"] == old.id
    assert verify_receipt(new.receipt, keys)["approval_id"] == new.id
    with pytest.raises(ReceiptError, match="not in the pinned key set"):
        verify_receipt(new.receipt, KeySet.from_jwks(jwks))
