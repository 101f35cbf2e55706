// The Vercel AI SDK (`ai`): answers the tool-approval requests of tools declared with
// `needsApproval` through countersign, in generateText / streamText loops.
import type {
  AssistantModelMessage,
  ModelMessage,
  ToolApprovalResponse,
  ToolModelMessage,
} from "ai";
import type { Client } from "../client.js";
import type { Arguments } from "../model.js";
import { ask, type GateOptions } from "./gate.js";

type ResponseMessage = AssistantModelMessage | ToolModelMessage;

export interface AnswerOptions extends GateOptions {
  signal?: AbortSignal;
}

export interface Answered {
  /** The step's response messages followed by a tool message with the answers: append them
   * to the conversation and call generateText / streamText again. */
  messages: ModelMessage[];
  /** How many approval requests were answered (0: the loop is done). */
  answered: number;
}

/**
 * Answers every open `tool-approval-request` of a step through countersign:
 *
 *     const result = await generateText({ model, tools, messages });
 *     const { messages: next, answered } = await answerToolApprovals(
 *       client, result.responseMessages, { agentId: "bot", sessionId: chatId });
 *     messages.push(...next); // and call generateText again while answered > 0
 *
 * (`result.responseMessages` of streamText, a promise, works as well.) Each request is sent
 * with the SDK's tool-call id as idempotency key. Approved: a `tool-approval-response` with
 * `approved: true`, so the SDK runs the tool; approved with edited arguments: the tool call in
 * the returned assistant message carries the edited input, which the SDK validates against the
 * tool's schema and runs (with `experimental_toolApprovalSecret` set, the SDK refuses the edited
 * call, as its signature covers the input). Anything else, and every failure (server
 * unreachable, token refused, expiry): `approved: false` with the approver's name and reason, or
 * the failure, as the reason the model reads in the denied tool result.
 */
export async function answerToolApprovals(
  client: Client,
  responseMessages: ResponseMessage[] | PromiseLike<ResponseMessage[]>,
  options: AnswerOptions,
): Promise<Answered> {
  const messages = structuredClone(await responseMessages);
  const answeredIds = new Set<string>();
  for (const message of messages) {
    if (message.role === "tool") {
      for (const part of message.content) {
        if (part.type === "tool-approval-response") {
          answeredIds.add(part.approvalId);
        }
      }
    }
  }
  const answers: ToolApprovalResponse[] = [];
  for (const message of messages) {
    if (message.role !== "assistant" || typeof message.content === "string") {
      continue;
    }
    for (const request of message.content) {
      if (
        request.type !== "tool-approval-request" ||
        request.isAutomatic ||
        answeredIds.has(request.approvalId)
      ) {
        continue;
      }
      const call = message.content.find(
        (part) => part.type === "tool-call" && part.toolCallId === request.toolCallId,
      );
      if (call?.type !== "tool-call") {
        answers.push({
          type: "tool-approval-response",
          approvalId: request.approvalId,
          approved: false,
          reason: `Tool call not run: its call ${request.toolCallId} is not in the response.`,
        });
        continue;
      }
      const verdict = await ask(
        client,
        { id: call.toolCallId, name: call.toolName, input: argumentsOf(call.input) },
        options,
        options.signal,
      );
      if (verdict.allow && verdict.approval.edited) {
        // The SDK runs the call as it stands in the history: the approved version.
        call.input = verdict.input;
        delete request.inputSchemaInput;
      }
      answers.push({
        type: "tool-approval-response",
        approvalId: request.approvalId,
        approved: verdict.allow,
        reason: verdict.allow ? verdict.approval.outcome : verdict.message,
      });
    }
  }
  if (answers.length > 0) {
    messages.push({ role: "tool", content: answers });
  }
  return { messages, answered: answers.length };
}

function argumentsOf(input: unknown): Arguments {
  return typeof input === "object" && input !== null && !Array.isArray(input)
    ? (input as Arguments)
    : { input };
}
