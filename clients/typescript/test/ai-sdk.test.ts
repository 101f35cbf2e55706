// The AI SDK adapter in real generateText / streamText loops with the SDK's own mock model.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { generateText, type ModelMessage, stepCountIs, streamText, tool } from "ai";
import { convertArrayToReadableStream, MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { answerToolApprovals } from "../src/adapters/ai-sdk.js";
import type { Client } from "../src/index.js";
import { agentId, decideNext, firstPending, Server, sharedServer } from "./support.js";

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A model that calls delete_file once, then answers with what the tool result said; it
 * records every prompt it was sent. */
function scriptedModel(prompts: unknown[]) {
  const answer = (prompt: unknown) => {
    prompts.push(prompt);
    const sawResult = JSON.stringify(prompt).includes('"tool-result"');
    return sawResult
      ? [{ type: "text" as const, text: "done" }]
      : [
          {
            type: "tool-call" as const,
            toolCallId: `call-${prompts.length}-${Math.random()}`,
            toolName: "delete_file",
            input: JSON.stringify({ path: "./build" }),
          },
        ];
  };
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const content = answer(prompt);
      const toolCall = content[0]?.type === "tool-call";
      return {
        content,
        finishReason: { unified: toolCall ? "tool-calls" : "stop", raw: undefined },
        usage,
        warnings: [],
      };
    },
    doStream: async ({ prompt }) => {
      const content = answer(prompt);
      const first = content[0];
      const parts =
        first?.type === "tool-call"
          ? [first]
          : [
              { type: "text-start" as const, id: "t" },
              { type: "text-delta" as const, id: "t", delta: "done" },
              { type: "text-end" as const, id: "t" },
            ];
      return {
        stream: convertArrayToReadableStream([
          { type: "stream-start" as const, warnings: [] },
          ...parts,
          {
            type: "finish" as const,
            finishReason: {
              unified: first?.type === "tool-call" ? "tool-calls" : "stop",
              raw: undefined,
            },
            usage,
          },
        ]),
      };
    },
  });
}

function deleteFile(ran: string[]) {
  return tool({
    description: "Deletes a file",
    inputSchema: z.object({ path: z.string() }),
    needsApproval: true,
    execute: async ({ path }) => {
      ran.push(path);
      return `deleted ${path}`;
    },
  });
}

/** The agent loop of the README: generateText, answer the approvals, again. */
async function loop(
  client: Client,
  agent: string,
  ran: string[],
  prompts: unknown[],
  deadlineMs?: number,
) {
  const model = scriptedModel(prompts);
  const tools = { delete_file: deleteFile(ran) };
  const messages: ModelMessage[] = [{ role: "user", content: "clean up" }];
  for (let round = 0; round < 3; round++) {
    const result = await generateText({ model, tools, messages, stopWhen: stepCountIs(3) });
    const next = await answerToolApprovals(client, result.responseMessages, {
      agentId: agent,
      sessionId: "chat-1",
      deadlineMs,
      requestRetryMs: 500,
    });
    messages.push(...next.messages);
    if (next.answered === 0) {
      return result;
    }
  }
  throw new Error("still waiting for approvals after 3 rounds");
}

describe("AI SDK adapter", () => {
  const shared = sharedServer();

  test("approved: the tool runs, with the tool-call id as idempotency key", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const decided = decideNext(shared.client, agent, { verdict: "approve" });
    const result = await loop(shared.client, agent, ran, []);
    const approval = await decided;
    assert.deepEqual(ran, ["./build"]);
    assert.equal(result.text, "done");
    assert.match(approval.idempotencyKey, /^call-1-/);
    assert.equal(approval.sessionId, "chat-1");
    assert.equal(approval.toolName, "delete_file");
  });

  test("rejected: the tool never runs and the model reads who rejected and why", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const prompts: unknown[] = [];
    const decided = decideNext(shared.client, agent, {
      verdict: "reject",
      reason: "keep the build",
    });
    await loop(shared.client, agent, ran, prompts);
    await decided;
    assert.deepEqual(ran, []);
    const last = JSON.stringify(prompts.at(-1));
    assert.match(last, /execution-denied/);
    assert.match(last, /rejected by Alice via cli: keep the build/);
  });

  test("approved with edited arguments: the tool runs with the edited input", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const decided = decideNext(shared.client, agent, {
      verdict: "approve",
      editedArguments: { path: "./build/cache" },
    });
    await loop(shared.client, agent, ran, []);
    await decided;
    assert.deepEqual(ran, ["./build/cache"]);
  });

  test("the server lost while waiting: denied, the tool never runs", async () => {
    const lost = await Server.start();
    const agent = agentId();
    const ran: string[] = [];
    const prompts: unknown[] = [];
    const lostClient = lost.client();
    const killed = firstPending(lostClient, agent).then(() => lost.kill());
    await loop(lostClient, agent, ran, prompts, 1_500);
    await killed;
    assert.deepEqual(ran, []);
    assert.match(JSON.stringify(prompts.at(-1)), /countersign could not decide/);
  });

  test("streamText: an approval request answered through countersign runs the tool", async () => {
    const agent = agentId();
    const ran: string[] = [];
    const model = scriptedModel([]);
    const tools = { delete_file: deleteFile(ran) };
    const messages: ModelMessage[] = [{ role: "user", content: "clean up" }];
    const decided = decideNext(shared.client, agent, { verdict: "approve" });
    const first = streamText({ model, tools, messages });
    const next = await answerToolApprovals(shared.client, first.responseMessages, {
      agentId: agent,
    });
    assert.equal(next.answered, 1);
    messages.push(...next.messages);
    const second = streamText({ model, tools, messages });
    assert.equal(await second.text, "done");
    await decided;
    assert.deepEqual(ran, ["./build"]);
  });
});
