// The Claude Agent SDK (@anthropic-ai/claude-agent-sdk): a `canUseTool` callback that asks
// countersign before each tool runs.
import type {
  CanUseTool,
  PermissionResult,
  PermissionUpdate,
} from "@anthropic-ai/claude-agent-sdk";
import type { Client } from "../client.js";
import { ask, type GateOptions } from "./gate.js";

export interface CanUseToolOptions extends Omit<GateOptions, "sessionId"> {
  /** The Claude session (the `session_id` of the query's messages), or a function giving it at
   * the time of the call: a session grant approves later calls of the tool in it. */
  sessionId?: string | (() => string | undefined);
}

/**
 * `query({ prompt, options: { canUseTool: countersignCanUseTool(client, { agentId }) } })`.
 *
 * Each call is requested with the SDK's tool-use id as idempotency key. Approved: allow, with
 * `updatedInput` set to the approved arguments (the approver's edit when they edited them);
 * approved for the session: also a session permission rule for the tool, so Claude asks no
 * more for it in this session (countersign's grant says the same). Anything else, and every
 * failure (server unreachable, token refused, expiry): deny, with the approver's name and
 * reason, or the failure, as the message Claude reads.
 */
export function countersignCanUseTool(client: Client, options: CanUseToolOptions): CanUseTool {
  return async (toolName, input, { signal, toolUseID }): Promise<PermissionResult> => {
    const sessionId =
      typeof options.sessionId === "function" ? options.sessionId() : options.sessionId;
    const verdict = await ask(
      client,
      { id: toolUseID, name: toolName, input },
      { ...options, sessionId },
      signal,
    );
    if (!verdict.allow) {
      return { behavior: "deny", message: verdict.message, toolUseID };
    }
    const forSession: PermissionUpdate[] = [
      { type: "addRules", rules: [{ toolName }], behavior: "allow", destination: "session" },
    ];
    return {
      behavior: "allow",
      updatedInput: verdict.input,
      ...(verdict.forSession ? { updatedPermissions: forSession } : {}),
      toolUseID,
    };
  };
}
