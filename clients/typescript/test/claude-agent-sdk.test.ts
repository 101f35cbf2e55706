// The Claude Agent SDK adapter, called as the SDK calls its CanUseTool callback.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { CanUseTool, PermissionResult } from "@anthropic-ai/claude-agent-sdk";
import { countersignCanUseTool } from "../src/adapters/claude-agent-sdk.js";
import {
  agentId,
  decideNext,
  firstPending,
  Server,
  sharedServer,
  TOKEN_ENV,
  TOKENS,
} from "./support.js";

/** One permission prompt, with the options the SDK passes. */
function ask(
  canUseTool: CanUseTool,
  toolUseID: string,
  input: Record<string, unknown>,
): Promise<PermissionResult> {
  return canUseTool("Bash", input, {
    signal: new AbortController().signal,
    toolUseID,
    requestId: `request-${toolUseID}`,
    suggestions: [],
  }) as Promise<PermissionResult>;
}

describe("Claude Agent SDK adapter", () => {
  const shared = sharedServer();

  test("approved: allow with the approved input; the tool-use id is the idempotency key", async () => {
    const agent = agentId();
    let session = "session-a";
    const canUseTool: CanUseTool = countersignCanUseTool(shared.client, {
      agentId: agent,
      sessionId: () => session,
    });
    const decided = decideNext(shared.client, agent, { verdict: "approve" });
    const result = await ask(canUseTool, "toolu_1", { command: "make clean" });
    const approval = await decided;
    assert.deepEqual(result, {
      behavior: "allow",
      updatedInput: { command: "make clean" },
      toolUseID: "toolu_1",
    });
    assert.equal(approval.idempotencyKey, "toolu_1");
    assert.equal(approval.sessionId, "session-a");
    session = "session-b";
    const again = decideNext(shared.client, agent, { verdict: "approve" });
    await ask(canUseTool, "toolu_2", { command: "ls" });
    assert.equal((await again).sessionId, "session-b");
  });

  test("rejected: deny with the approver's name and reason as the message", async () => {
    const agent = agentId();
    const canUseTool = countersignCanUseTool(shared.client, { agentId: agent });
    const decided = decideNext(shared.client, agent, { verdict: "reject", reason: "not in prod" });
    const result = await ask(canUseTool, "toolu_r", { command: "rm -rf /" });
    await decided;
    assert.equal(result.behavior, "deny");
    assert.match(
      result.behavior === "deny" ? result.message : "",
      /rejected by Alice via cli: not in prod/,
    );
  });

  test("approved with edited arguments: allow with the edited input", async () => {
    const agent = agentId();
    const canUseTool = countersignCanUseTool(shared.client, { agentId: agent });
    const decided = decideNext(shared.client, agent, {
      verdict: "approve",
      editedArguments: { command: "rm -rf ./build/cache" },
    });
    const result = await ask(canUseTool, "toolu_e", { command: "rm -rf ./build" });
    await decided;
    assert.equal(result.behavior, "allow");
    assert.deepEqual(result.behavior === "allow" && result.updatedInput, {
      command: "rm -rf ./build/cache",
    });
  });

  test("approved for the session: a session permission rule for the tool", async () => {
    const agent = agentId();
    const canUseTool = countersignCanUseTool(shared.client, { agentId: agent, sessionId: "s" });
    const decided = decideNext(shared.client, agent, { verdict: "approve", scope: "session" });
    const result = await ask(canUseTool, "toolu_s", { command: "make" });
    await decided;
    assert.equal(result.behavior, "allow");
    assert.deepEqual(result.behavior === "allow" && result.updatedPermissions, [
      {
        type: "addRules",
        rules: [{ toolName: "Bash" }],
        behavior: "allow",
        destination: "session",
      },
    ]);
  });

  test("nobody decided before the expiry: deny, saying so", async () => {
    const canUseTool = countersignCanUseTool(shared.client, { agentId: agentId(), ttlSeconds: 1 });
    const result = await ask(canUseTool, "toolu_x", { command: "make" });
    assert.equal(result.behavior, "deny");
    assert.match(result.behavior === "deny" ? result.message : "", /not approved \(expired/);
  });

  test("a token the server refuses: deny", async () => {
    const guarded = await Server.start(TOKENS, TOKEN_ENV);
    try {
      const refused = guarded.client({ token: "wrong-token-0123456789" });
      const canUseTool = countersignCanUseTool(refused, { agentId: "coder-1" });
      const result = await ask(canUseTool, "toolu_t", { command: "make" });
      assert.equal(result.behavior, "deny");
      assert.match(result.behavior === "deny" ? result.message : "", /Unauthenticated/);
    } finally {
      await guarded.kill();
    }
  });

  test("the server lost, before the request or while waiting: deny", async () => {
    const lost = await Server.start();
    const agent = agentId();
    const lostClient = lost.client();
    const canUseTool = countersignCanUseTool(lostClient, {
      agentId: agent,
      deadlineMs: 1_500,
      requestRetryMs: 500,
    });
    const waiting = ask(canUseTool, "toolu_l1", { command: "make" });
    await firstPending(lostClient, agent);
    await lost.kill();
    const result = await waiting;
    assert.equal(result.behavior, "deny");
    assert.match(result.behavior === "deny" ? result.message : "", /countersign could not decide/);
    const down = await ask(canUseTool, "toolu_l2", { command: "make" });
    assert.equal(down.behavior, "deny");
  });
});
