// What the framework adapters share: ask countersign about one tool call and turn the answer,
// or any failure, into allow-with-these-arguments or deny-with-this-message (fail closed).
import type { Client } from "../client.js";
import type { Approval, Arguments, Risk } from "../model.js";

/** Options every adapter takes. */
export interface GateOptions {
  /** The agent asking (the token must be allowed to act for it). */
  agentId: string;
  /** The conversation or thread; a session grant approves later calls of the same tool in
   * it. */
  sessionId?: string;
  /** Default "medium" (the server's policy may raise it). */
  risk?: Risk;
  /** Seconds the approval stays open; default: the server's. */
  ttlSeconds?: number;
  /** How long to wait for a decision, in milliseconds; default: the approval's expiry. */
  deadlineMs?: number;
  /** How long to keep resending a request the server did not answer (down, restarting)
   * before denying. Default 5 s. */
  requestRetryMs?: number;
  /** The one-line summary an approver reads; default "<tool name> <arguments>". */
  action?: (toolName: string, input: Arguments) => string;
  /** Where to send the approval; default: every channel. */
  routes?: { channel: string; target?: string }[];
  labels?: Record<string, string>;
}

/** One tool call, as a framework reports it. */
export interface ToolCall {
  /** The framework's id for the call: the idempotency key (a resumed run never asks twice). */
  id: string;
  name: string;
  input: Arguments;
}

export type GateVerdict =
  | {
      allow: true;
      approval: Approval;
      /** The arguments the call must run with: the approved, possibly edited, version. */
      input: Arguments;
      /** The approver allowed later calls of this tool in the session. */
      forSession: boolean;
    }
  | {
      allow: false;
      /** What the model is told: who decided and why, or why countersign could not decide. */
      message: string;
      /** The approval, when countersign answered. */
      approval?: Approval;
    };

/** The default request retry window: a server that does not answer within it is a "no". */
export const REQUEST_RETRY_MS = 5_000;

/** How much of a call's arguments an action line quotes (as the hooks' and the Python
 * adapters' action lines do). */
const MAX_QUOTED_CHARS = 300;

/** The one-line action an approver reads on a phone: the tool and its arguments as compact
 * JSON, cut to MAX_QUOTED_CHARS (e.g. `send_email {"to":"a@b","subject":"Hi"}`). */
function defaultAction(toolName: string, input: Arguments): string {
  const text = JSON.stringify(input);
  const quoted = text.length > MAX_QUOTED_CHARS ? `${text.slice(0, MAX_QUOTED_CHARS - 1)}…` : text;
  return `${toolName} ${quoted}`;
}

/** What a model is told when its tool call may not run: the outcome and the reason. */
export function rejectionText(approval: Approval): string {
  return `Tool call not approved (${approval.outcome}). Do not retry it unless the user asks.`;
}

/** Asks countersign about `call` and waits for the decision. Never throws: every failure
 * (server unreachable, token refused, expiry, abort) is a denial that says what happened. */
export async function ask(
  client: Client,
  call: ToolCall,
  options: GateOptions,
  signal?: AbortSignal,
): Promise<GateVerdict> {
  let approval: Approval;
  try {
    if (!call.id) {
      throw new Error(`tool call ${call.name} has no call id to make its approval idempotent`);
    }
    approval = await client.requestAndWait(
      {
        agentId: options.agentId,
        sessionId: options.sessionId ?? "",
        idempotencyKey: call.id,
        toolName: call.name,
        arguments: call.input,
        action: (options.action ?? defaultAction)(call.name, call.input),
        risk: options.risk ?? "medium",
        ttlSeconds: options.ttlSeconds,
        routes: options.routes,
        labels: options.labels,
      },
      {
        deadlineMs: options.deadlineMs,
        requestRetryMs: options.requestRetryMs ?? REQUEST_RETRY_MS,
        signal,
      },
    );
  } catch (error) {
    return {
      allow: false,
      message: `Tool call not run: countersign could not decide (${(error as Error).message}). Do not retry it unless the user asks.`,
    };
  }
  if (!approval.approved) {
    return { allow: false, approval, message: rejectionText(approval) };
  }
  const input = approval.edited ? approval.editedArguments : call.input;
  if (input === undefined) {
    return {
      allow: false,
      approval,
      message: `Tool call not run: ${approval.outcome}, with edited arguments that are not available.`,
    };
  }
  return { allow: true, approval, input, forSession: approval.scope === "session" };
}
