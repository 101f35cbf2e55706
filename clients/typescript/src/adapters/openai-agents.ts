// The OpenAI Agents SDK for JavaScript (@openai/agents): resolves a run's interruptions (tools
// declared with `needsApproval`) through countersign, then resumes the run.
import {
  type Agent,
  type FunctionTool,
  type NonStreamRunOptions,
  type RunResult,
  type RunToolApprovalItem,
  run,
} from "@openai/agents";
import type { Client } from "../client.js";
import type { Arguments } from "../model.js";
import { ask, type GateOptions } from "./gate.js";

export interface ResolveOptions extends GateOptions {
  signal?: AbortSignal;
}

/** What the model is told when its call was approved only with other arguments and the SDK
 * could not be made to run those. */
function editedText(outcome: string, edited: Arguments): string {
  return `Tool call not run as requested: ${outcome}, only with these edited arguments: ${JSON.stringify(edited)}. Call the tool again with exactly these arguments if you still need it.`;
}

function argumentsOf(item: RunToolApprovalItem): Arguments {
  if (!item.arguments) {
    return {};
  }
  const parsed: unknown = JSON.parse(item.arguments);
  return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)
    ? (parsed as Arguments)
    : { arguments: parsed };
}

function callIdOf(item: RunToolApprovalItem): string {
  const raw = item.rawItem as { callId?: string; id?: string };
  return raw.callId ?? raw.id ?? "";
}

/** The calls an approver approved with edited arguments, per tool made editable. */
// biome-ignore lint/suspicious/noExplicitAny: any function tool.
const editsOf = new WeakMap<FunctionTool<any, any, any>, Map<string, string>>();

/**
 * The tool, able to run with the arguments an approver edited: the SDK approves a call only
 * with the arguments the model gave (it refuses a changed invocation), so the edit is applied
 * when the approved call is invoked. Without it an edited approval is a rejection that tells
 * the model the approved arguments.
 *
 *     new Agent({ name: "janitor", tools: [editableTool(deleteFile)] })
 */
// biome-ignore lint/suspicious/noExplicitAny: any function tool.
export function editableTool<T extends FunctionTool<any, any, any>>(tool: T): T {
  const edits = new Map<string, string>();
  const editable: T = {
    ...tool,
    invoke: (runContext, input, details) => {
      const callId = details?.toolCall?.callId;
      const edited = callId === undefined ? undefined : edits.get(callId);
      if (callId !== undefined) {
        edits.delete(callId);
      }
      return tool.invoke(runContext, edited ?? input, details);
    },
  };
  editsOf.set(editable, edits);
  return editable;
}

/** Where to put an approved edit of `item`'s call: its tool's edits, when it is editable. */
function editsFor(item: RunToolApprovalItem): Map<string, string> | undefined {
  for (const tool of item.agent.tools) {
    if (tool.type === "function" && tool.name === item.name) {
      return editsOf.get(tool);
    }
  }
  return undefined;
}

/**
 * Approves or rejects every interruption of `result` on its run state, as countersign
 * decides; run the state again to continue. Each call is requested with its call id as
 * idempotency key (a resumed run never asks twice). Approved: `state.approve(item)`, with
 * `alwaysApprove` when the approver allowed the tool for the session; approved with edited
 * arguments: approved, and run with the edited arguments when the tool is an `editableTool`,
 * else rejected with the approved arguments in the message (never run as requested). Anything else, and every failure (server unreachable,
 * token refused, expiry): `state.reject(item, { message })` with the approver's name and
 * reason, or the failure, which the model reads.
 */
// biome-ignore lint/suspicious/noExplicitAny: the SDK's own RunResult is generic over any agent.
export async function resolveInterruptions<R extends RunResult<any, any>>(
  client: Client,
  result: R,
  options: ResolveOptions,
): Promise<R["state"]> {
  const state = result.state;
  for (const item of result.interruptions) {
    let input: Arguments;
    try {
      input = argumentsOf(item);
    } catch (error) {
      state.reject(item, {
        message: `Tool call not run: its arguments are not JSON (${(error as Error).message}).`,
      });
      continue;
    }
    const verdict = await ask(
      client,
      { id: callIdOf(item), name: item.name ?? "", input },
      options,
      options.signal,
    );
    if (!verdict.allow) {
      state.reject(item, { message: verdict.message });
      continue;
    }
    if (verdict.approval.edited) {
      const edits = editsFor(item);
      if (edits === undefined) {
        state.reject(item, { message: editedText(verdict.approval.outcome, verdict.input) });
        continue;
      }
      edits.set(callIdOf(item), JSON.stringify(verdict.input));
    }
    state.approve(item, { alwaysApprove: verdict.forSession });
  }
  return state;
}

export interface RunWithApprovalsOptions extends ResolveOptions {
  /** Options for every `run` call (context, maxTurns, session, ...); not `stream`. Without a
   * `sessionId` of its own, countersign's session is the run's `session` (its
   * getSessionId()) or `conversationId`. */
  // biome-ignore lint/suspicious/noExplicitAny: as the SDK's own run options.
  runOptions?: NonStreamRunOptions<any, any>;
  /** Rounds of approvals before giving up. Default 100. */
  maxRounds?: number;
}

/**
 * `run(agent, input)` until no interruption remains, each resolved through countersign:
 *
 *     const result = await runWithApprovals(client, agent, "clean up", { agentId: "janitor" });
 */
// biome-ignore lint/suspicious/noExplicitAny: the SDK's own Agent is generic over any context.
export async function runWithApprovals<A extends Agent<any, any>>(
  client: Client,
  agent: A,
  input: Parameters<typeof run<A>>[1],
  options: RunWithApprovalsOptions,
  // biome-ignore lint/suspicious/noExplicitAny: as the SDK's own RunResult.
): Promise<RunResult<any, A>> {
  let result = await run(agent, input, options.runOptions);
  // The run's own session or conversation is the countersign session unless one is given.
  const sessionId =
    options.sessionId ??
    (await options.runOptions?.session?.getSessionId()) ??
    options.runOptions?.conversationId;
  const maxRounds = options.maxRounds ?? 100;
  for (let round = 0; round < maxRounds; round++) {
    if (result.interruptions.length === 0) {
      return result;
    }
    const state = await resolveInterruptions(client, result, { ...options, sessionId });
    result = await run(agent, state, options.runOptions);
  }
  throw new Error(`the run was still interrupted after ${maxRounds} rounds of approvals`);
}
