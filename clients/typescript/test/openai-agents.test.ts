// The OpenAI Agents SDK adapter: real runs of a real Agent with a scripted model.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  Agent,
  MemorySession,
  type Model,
  type ModelRequest,
  type ModelResponse,
  setTracingDisabled,
  tool,
  Usage,
} from "@openai/agents";
import { z } from "zod";
import {
  editableTool,
  resolveInterruptions,
  runWithApprovals,
} from "../src/adapters/openai-agents.js";
import { agentId, decideNext, firstPending, Server, sharedServer } from "./support.js";

setTracingDisabled(true); // no network

/** Calls delete_file once, then answers "done"; records what it was sent. */
class ScriptedModel implements Model {
  readonly inputs: string[] = [];
  private calls = 0;

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const input = JSON.stringify(request.input);
    this.inputs.push(input);
    this.calls += 1;
    if (input.includes("function_call_result")) {
      return {
        usage: new Usage(),
        output: [
          {
            type: "message",
            role: "assistant",
            status: "completed",
            content: [{ type: "output_text", text: "done" }],
          },
        ],
      };
    }
    return {
      usage: new Usage(),
      output: [
        {
          type: "function_call",
          callId: `call-${this.calls}-${Math.random()}`,
          name: "delete_file",
          arguments: JSON.stringify({ path: "./build" }),
          status: "completed",
        },
      ],
    };
  }

  // biome-ignore lint/correctness/useYield: this model is only used without streaming.
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not streamed");
  }
}

function janitor(ran: string[], editable = true) {
  const model = new ScriptedModel();
  const deleteFile = tool({
    name: "delete_file",
    description: "Deletes a file",
    parameters: z.object({ path: z.string() }),
    needsApproval: true,
    execute: async ({ path }) => {
      ran.push(path);
      return `deleted ${path}`;
    },
  });
  const tools = [editable ? editableTool(deleteFile) : deleteFile];
  return { model, agent: new Agent({ name: "janitor", model, tools }) };
}

describe("OpenAI Agents SDK adapter", () => {
  const shared = sharedServer();

  test("approved: the tool runs; the call id is the idempotency key", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const { agent: janitorAgent } = janitor(ran);
    const decided = decideNext(shared.client, agent, { verdict: "approve" });
    const result = await runWithApprovals(shared.client, janitorAgent, "clean up", {
      agentId: agent,
      sessionId: "thread-1",
    });
    const approval = await decided;
    assert.deepEqual(ran, ["./build"]);
    assert.equal(result.finalOutput, "done");
    assert.match(approval.idempotencyKey, /^call-1-/);
    assert.equal(approval.sessionId, "thread-1");
    assert.deepEqual(approval.arguments, { path: "./build" });
  });

  test("the run's session is countersign's session", async () => {
    const agent = agentId();
    const { agent: janitorAgent } = janitor([]);
    const session = new MemorySession({ sessionId: "memory-session-1" });
    const decided = decideNext(shared.client, agent, { verdict: "approve" });
    await runWithApprovals(shared.client, janitorAgent, "clean up", {
      agentId: agent,
      runOptions: { session },
    });
    assert.equal((await decided).sessionId, "memory-session-1");
  });

  test("rejected: the tool never runs and the model reads who rejected and why", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const { model, agent: janitorAgent } = janitor(ran);
    const decided = decideNext(shared.client, agent, {
      verdict: "reject",
      reason: "keep the build",
    });
    await runWithApprovals(shared.client, janitorAgent, "clean up", { agentId: agent });
    await decided;
    assert.deepEqual(ran, []);
    assert.match(model.inputs.at(-1) ?? "", /rejected by Alice via cli: keep the build/);
  });

  test("approved with edited arguments: the tool runs with the edited input", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const { agent: janitorAgent } = janitor(ran);
    const decided = decideNext(shared.client, agent, {
      verdict: "approve",
      editedArguments: { path: "./build/cache" },
    });
    await runWithApprovals(shared.client, janitorAgent, "clean up", { agentId: agent });
    await decided;
    assert.deepEqual(ran, ["./build/cache"]);
  });

  test("approved with edits, the tool not editable: rejected, the model reads the edit", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const { model, agent: janitorAgent } = janitor(ran, false);
    const decided = decideNext(shared.client, agent, {
      verdict: "approve",
      editedArguments: { path: "./build/cache" },
    });
    await runWithApprovals(shared.client, janitorAgent, "clean up", { agentId: agent });
    await decided;
    assert.deepEqual(ran, []);
    assert.match(model.inputs.at(-1) ?? "", /only with these edited arguments/);
    assert.match(model.inputs.at(-1) ?? "", /build\/cache/);
  });

  test("approved for the session: later calls of the tool in the run need no approval", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const { agent: janitorAgent } = janitor(ran);
    const { run } = await import("@openai/agents");
    const first = await run(janitorAgent, "clean up");
    assert.equal(first.interruptions.length, 1);
    const decided = decideNext(shared.client, agent, { verdict: "approve", scope: "session" });
    const state = await resolveInterruptions(shared.client, first, {
      agentId: agent,
      sessionId: "thread-2",
    });
    await decided;
    const item = first.interruptions[0];
    assert.ok(item);
    assert.equal(
      state._context.isToolApproved({ toolName: "delete_file", callId: "another" }),
      true,
    );
  });

  test("the server lost while waiting: denied, the tool never runs", async () => {
    const lost = await Server.start();
    const agent = agentId();
    const ran: string[] = [];
    const { model, agent: janitorAgent } = janitor(ran);
    const lostClient = lost.client();
    const killed = firstPending(lostClient, agent).then(() => lost.kill());
    await runWithApprovals(lostClient, janitorAgent, "clean up", {
      agentId: agent,
      deadlineMs: 1_500,
      requestRetryMs: 500,
    });
    await killed;
    assert.deepEqual(ran, []);
    assert.match(model.inputs.at(-1) ?? "", /countersign could not decide/);
  });
});
