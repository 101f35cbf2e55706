"""The open-standards front door (docs/standards.md), conformance-style, against the real
server binary over HTTP: the AuthZEN Authorization API 1.0 metadata, single and batch access
evaluations answered by the server's policy rules (allow, deny, a person must decide), and
refusals that name the field at fault."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Server, free_port

RULES = """
[[rules]]
name = "no-table-drops"
action = "deny"
reason = "dropping tables is never allowed"
[rules.match]
tool = "sql.*"
arguments = [{ pointer = "/query", regex = "(?i)\\\\bdrop\\\\s+table\\\\b" }]

[[rules]]
name = "reads-are-fine"
action = "allow"
[rules.match]
tool = "read_file"
"""


class Front:
    """The server's [http] listener."""

    def __init__(self, server: Server, port: int) -> None:
        self.server = server
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=10) as response:
            assert response.headers.get_content_type() == "application/json"
            return json.load(response)

    def post(self, path: str, body: object) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as refused:
            return refused.code, json.load(refused)


@pytest.fixture(scope="module")
def front(start_server: Callable[..., Server]) -> Front:
    port = free_port()
    server = start_server(RULES, http={"listen": f"127.0.0.1:{port}"})
    return Front(server, port)


def call(tool: str, arguments: dict[str, object], risk: str = "medium") -> dict[str, object]:
    return {
        "subject": {"type": "agent", "id": "agent-py"},
        "resource": {"type": "tool", "id": tool, "properties": {"arguments": arguments, "risk": risk}},
        "action": {"name": "call"},
    }


def test_the_pdp_metadata_names_its_endpoints(front: Front) -> None:
    metadata = front.get("/.well-known/authzen-configuration")
    assert metadata["policy_decision_point"] == front.base
    assert metadata["access_evaluation_endpoint"] == front.base + "/access/v1/evaluation"
    assert metadata["access_evaluations_endpoint"] == front.base + "/access/v1/evaluations"


def test_a_rule_that_allows_is_decision_true(front: Front) -> None:
    status, answer = front.post("/access/v1/evaluation", call("read_file", {"path": "README"}))
    assert status == 200
    assert answer["decision"] is True
    assert answer["context"]["rule"] == "reads-are-fine"


def test_a_rule_that_denies_is_decision_false_with_its_reason(front: Front) -> None:
    status, answer = front.post("/access/v1/evaluation", call("sql.exec", {"query": "drop table users"}))
    assert status == 200
    assert answer["decision"] is False
    assert answer["context"]["reason"] == "dropping tables is never allowed"


def test_a_call_left_to_a_person_says_how_to_ask(front: Front) -> None:
    status, answer = front.post("/access/v1/evaluation", call("deploy", {"env": "prod"}, "high"))
    assert status == 200
    assert answer["decision"] is False
    context = answer["context"]
    assert context["require_human"] is True
    assert context["ask"]["grpc_method"] == "countersign.v1.ApprovalService/RequestApproval"
    assert context["ask"]["approval"]["arguments"] == {"env": "prod"}
    assert context["ask"]["approval"]["risk"] == "high"


def test_a_batch_shares_defaults_and_short_circuits(front: Front) -> None:
    batch: dict[str, Any] = {
        **call("read_file", {}),
        "evaluations": [
            {},
            {
                "resource": {
                    "type": "tool",
                    "id": "sql.exec",
                    "properties": {"arguments": {"query": "DROP TABLE t"}, "risk": "low"},
                }
            },
            {},
        ],
    }
    status, answer = front.post("/access/v1/evaluations", batch)
    assert status == 200
    assert [e["decision"] for e in answer["evaluations"]] == [True, False, True]

    batch["options"] = {"evaluations_semantic": "deny_on_first_deny"}
    _, stopped = front.post("/access/v1/evaluations", batch)
    assert [e["decision"] for e in stopped["evaluations"]] == [True, False]

    batch["options"] = {"evaluations_semantic": "sometimes"}
    status, refused = front.post("/access/v1/evaluations", batch)
    assert status == 400
    assert refused["error_description"].startswith("options.evaluations_semantic:")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b["resource"]["properties"].pop("risk"), "resource.properties.risk"),
        (lambda b: b["resource"]["properties"].update(arguments=[1, 2]), "resource.properties.arguments"),
        (lambda b: b["subject"].update(type="user"), "subject.type"),
        (lambda b: b.pop("action"), "action"),
    ],
)
def test_a_malformed_evaluation_is_invalid_request_naming_the_field(
    front: Front, change: Callable[[dict[str, Any]], object], field: str
) -> None:
    body: dict[str, Any] = call("read_file", {})
    change(body)
    status, answer = front.post("/access/v1/evaluation", body)
    assert status == 400
    assert answer["error"] == "invalid_request"
    assert answer["error_description"].startswith(f"{field}:")
