// The OpenAI Agents SDK for JavaScript (@openai/agents): resolves a run's interruptions (tools
// declared with `needsApproval`) through countersign, then resumes the run.
import {
  type Agent,
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

/** True when the run state's pending call `callId` will run with `argumentsJson`: read from
 * the state's own serialized form, so that an SDK that keeps the call elsewhere is noticed. */
function pendingCallRuns(
  state: { toJSON(): unknown },
  callId: string,
  argumentsJson: string,
): boolean {
  const serialized = state.toJSON() as {
    lastProcessedResponse?: {
      functions?: { toolCall?: { callId?: string; arguments?: string } }[];
    };
  };
  const pending = serialized.lastProcessedResponse?.functions?.filter(
    (f) => f.toolCall?.callId === callId,
  );
  return (
    pending !== undefined &&
    pending.length > 0 &&
    pending.every((f) => f.toolCall?.arguments === argumentsJson)
  );
}

/**
 * Approves or rejects every interruption of `result` on its run state, as countersign
 * decides; run the state again to continue. Each call is requested with its call id as
 * idempotency key (a resumed run never asks twice). Approved: `state.approve(item)`, with
 * `alwaysApprove` when the approver allowed the tool for the session; approved with edited
 * arguments: the pending call is given the edited arguments, then approved (when the SDK's
 * state does not take them, the call is rejected with the approved arguments in the message
 * instead: never run as requested). Anything else, and every failure (server unreachable,
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
      const edited = JSON.stringify(verdict.input);
      const raw = item.rawItem as { type: string; arguments?: string };
      if (raw.type === "function_call") {
        raw.arguments = edited;
      }
      if (!pendingCallRuns(state, callIdOf(item), edited)) {
        state.reject(item, { message: editedText(verdict.approval.outcome, verdict.input) });
        continue;
      }
    }
    state.approve(item, { alwaysApprove: verdict.forSession });
  }
  return state;
}

export interface RunWithApprovalsOptions extends ResolveOptions {
  /** Options for every `run` call (context, maxTurns, ...); not `stream`. */
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
  const maxRounds = options.maxRounds ?? 100;
  for (let round = 0; round < maxRounds; round++) {
    if (result.interruptions.length === 0) {
      return result;
    }
    const state = await resolveInterruptions(client, result, options);
    result = await run(agent, state, options.runOptions);
  }
  throw new Error(`the run was still interrupted after ${maxRounds} rounds of approvals`);
}
