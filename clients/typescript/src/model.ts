// Plain objects for what the server returns, and the request an agent sends. Enums are
// lower-case strings (the proto names without their prefix): "pending", "approve", "high".
import { create } from "@bufbuild/protobuf";
import { type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";
import * as pb from "./gen/countersign/v1/approval_pb.js";

export type Risk = "low" | "medium" | "high" | "critical";
export type State = "pending" | "approved" | "rejected" | "expired" | "cancelled" | "consumed";
export type Scope = "once" | "session";
export type Verdict = "approve" | "reject";
export type ResolvedBy = "decision" | "rule" | "grant" | "expiry" | "cancellation";
export type DecideOutcome = "recorded" | "resolved" | "already_resolved" | "duplicate";
export type ConsumeOutcome = "succeeded" | "failed" | "handed_off";
export type EventKind =
  | "requested"
  | "decision_recorded"
  | "resolved"
  | "expired"
  | "cancelled"
  | "consumed"
  | "delivered"
  | "decision_refused"
  | "grant_revoked"
  | "rule_accepted"
  | "reminded"
  | "escalated";

/** A JSON object: a tool call's arguments. */
export type Arguments = Record<string, unknown>;

/** Who decided: a platform identity. */
export interface Decider {
  channel: string;
  userId: string;
  displayName?: string;
}

export interface Decision {
  verdict: Verdict | undefined;
  scope: Scope;
  reason: string;
  decider: Decider | undefined;
  decidedAt: Date | undefined;
  /** The version of the arguments decided on (their digest). */
  argsDigest: string;
  /** Set when this decision edited the arguments (edit-on-approve). */
  editedArguments: Arguments | undefined;
}

/** How an approved call went, as its runtime reported with `consume`. */
export interface Consumption {
  outcome: ConsumeOutcome | undefined;
  detail: string;
  consumedAt: Date | undefined;
}

/** An approval as the server reported it. Only `approved` means go ahead. */
export interface Approval {
  id: string;
  state: State;
  /** True only for state "approved": the call may run now. */
  approved: boolean;
  pending: boolean;
  agentId: string;
  sessionId: string;
  requester: string;
  idempotencyKey: string;
  toolName: string;
  /** The arguments as requested (undefined when redacted from storage). */
  arguments: Arguments | undefined;
  argsDigest: string;
  action: string;
  /** Why the agent asked. */
  requestReason: string;
  risk: Risk | undefined;
  requiredApprovals: number;
  labels: Record<string, string>;
  decisions: Decision[];
  /** What ended the pending state (undefined while pending). */
  resolvedBy: ResolvedBy | undefined;
  /** The people whose decisions resolved it. */
  deciders: Decider[];
  /** The resolution's reason: the approver's words, or the rule's. */
  reason: string;
  /** The policy rule that resolved it, or "". */
  rule: string;
  /** The session grant that approved it, or "". */
  grantId: string;
  /** "session" when an approving decision granted later calls of the tool in the session;
   * "once" for any other approval; undefined when not approved. */
  scope: Scope | undefined;
  /** True when an approver edited the arguments: run `argumentsToRun`, not `arguments`. */
  edited: boolean;
  editedArguments: Arguments | undefined;
  editedArgsDigest: string;
  editor: Decider | undefined;
  /** What the call must run with: the edited arguments when edited (undefined when they
   * are not available, being redacted: then nothing may run). */
  argumentsToRun: Arguments | undefined;
  /** The digest of the version to run: what `consume` reports as run. */
  currentArgsDigest: string;
  createdAt: Date | undefined;
  expiresAt: Date | undefined;
  resolvedAt: Date | undefined;
  consumption: Consumption | undefined;
  /** One line for people and models: the state, who or what decided, and why. */
  outcome: string;
  /** The decision receipt the server signed once a verdict resolved it (a compact JWS);
   * requestAndWait returns an approval only when it verifies (receipts.ts). */
  receipt: string;
}

/** What an agent asks for. `idempotencyKey` makes retries safe: the runtime's tool-call id
 * is the natural choice; one is generated when empty. */
export interface ApprovalRequest {
  agentId: string;
  toolName: string;
  arguments?: Arguments;
  action?: string;
  reason?: string;
  risk?: Risk;
  sessionId?: string;
  requester?: string;
  idempotencyKey?: string;
  /** Where to send it, e.g. [{ channel: "telegram", target: "-100123" }]; empty: everywhere. */
  routes?: { channel: string; target?: string }[];
  requiredApprovals?: number;
  /** Seconds the approval stays open; undefined: the server's default. */
  ttlSeconds?: number;
  labels?: Record<string, string>;
}

/** One event of a watch, each seq delivered once and in order. */
export interface ApprovalEvent {
  type: "event";
  seq: bigint;
  kind: EventKind;
  approval: Approval | undefined;
  decision: Decision | undefined;
  at: Date | undefined;
  /** What happened, for people (reminders, escalations, refused decisions). */
  detail: string;
  /** The history id of the event log `seq` belongs to: store it with the seq and resume with
   * both (`afterSeq`, `historyId`). A restore of the server's database begins a new history,
   * whose seqs name other events. */
  historyId: string;
}

/** Every pending approval (first item of a snapshot watch, and again after a resync);
 * `headSeq` is the seq the watch continues after. */
export interface Snapshot {
  type: "snapshot";
  approvals: Approval[];
  headSeq: bigint;
  /** The history id of the event log `headSeq` belongs to (see `ApprovalEvent.historyId`). */
  historyId: string;
}

/** Lower-case name of a generated enum value (prefix already stripped); undefined for
 * UNSPECIFIED. */
function nameOf<T extends string>(values: Record<number, string>, value: number): T | undefined {
  const name = values[value];
  if (name === undefined || name === "UNSPECIFIED") {
    return undefined;
  }
  return name.toLowerCase() as T;
}

/** The proto enum number of a lower-case name; the TypeError names the field and its choices
 * (plain JavaScript may pass anything, `risk: 2` included). */
function numberOf(values: Record<string, string | number>, kind: string, name: unknown): number {
  const key = typeof name === "string" ? name.toUpperCase() : undefined;
  const value = key === undefined || key === "UNSPECIFIED" ? undefined : values[key];
  if (typeof value !== "number") {
    const choices = Object.keys(values)
      .filter((key) => Number.isNaN(Number(key)) && key !== "UNSPECIFIED")
      .map((key) => key.toLowerCase());
    const given =
      typeof name === "string" ? JSON.stringify(name) : `${String(name)} (${typeof name})`;
    throw new TypeError(
      `${kind} must be one of ${choices.map((c) => `"${c}"`).join(", ")}, not ${given}`,
    );
  }
  return value;
}

export const riskProto = (name: Risk): pb.Risk => numberOf(pb.Risk, "risk", name);
export const stateProto = (name: State): pb.ApprovalState =>
  numberOf(pb.ApprovalState, "state", name);
export const verdictProto = (name: Verdict): pb.Verdict => numberOf(pb.Verdict, "verdict", name);
export const scopeProto = (name: Scope): pb.Scope => numberOf(pb.Scope, "scope", name);
export const consumeOutcomeProto = (name: ConsumeOutcome): pb.ConsumeOutcome =>
  numberOf(pb.ConsumeOutcome, "outcome", name);
export const decideOutcomeOf = (value: pb.DecideOutcome): DecideOutcome | undefined =>
  nameOf(pb.DecideOutcome, value);

function time(value: Timestamp | undefined): Date | undefined {
  return value === undefined ? undefined : timestampDate(value);
}

function jsonObject(text: string): Arguments | undefined {
  return text ? (JSON.parse(text) as Arguments) : undefined;
}

function deciderOf(message: pb.Decider | undefined): Decider | undefined {
  return message === undefined
    ? undefined
    : { channel: message.channel, userId: message.userId, displayName: message.displayName };
}

function decisionOf(message: pb.Decision): Decision {
  return {
    verdict: nameOf(pb.Verdict, message.verdict),
    scope: nameOf<Scope>(pb.Scope, message.scope) ?? "once",
    reason: message.reason,
    decider: deciderOf(message.decider),
    decidedAt: time(message.decidedAt),
    argsDigest: message.argsDigest,
    editedArguments: jsonObject(message.editedArgumentsJson),
  };
}

function deciderText(decider: Decider): string {
  return `${decider.displayName || decider.userId} via ${decider.channel}`;
}

export function approvalOf(message: pb.Approval): Approval {
  const state = nameOf<State>(pb.ApprovalState, message.state) ?? "pending";
  const resolution = message.resolution;
  const resolvedBy = nameOf<ResolvedBy>(pb.ResolvedBy, resolution?.resolvedBy ?? 0);
  const deciders = (resolution?.deciders ?? []).map((d) => deciderOf(d) as Decider);
  const decisions = message.decisions.map(decisionOf);
  const reason = resolution?.reason ?? "";
  const edited = message.editedArgsDigest !== "";
  const args = jsonObject(message.argumentsJson);
  const editedArguments = jsonObject(message.editedArgumentsJson);
  let scope: Scope | undefined;
  if (state === "approved" || state === "consumed") {
    const approving = decisions.filter((d) => d.verdict === "approve");
    scope = approving.some((d) => d.scope === "session") ? "session" : "once";
  }
  let outcome: string = state;
  if (resolvedBy === "decision" && deciders.length > 0) {
    outcome += ` by ${deciders.map(deciderText).join(", ")}`;
  } else if (resolvedBy === "rule" && resolution?.rule) {
    outcome += ` by policy rule ${resolution.rule}`;
  } else if (resolvedBy === "grant" && resolution?.grantId) {
    outcome += ` by session grant ${resolution.grantId}`;
  }
  if (reason) {
    outcome += `: ${reason}`;
  }
  const consumption = message.consumption;
  return {
    id: message.id,
    state,
    approved: state === "approved",
    pending: state === "pending",
    agentId: message.agentId,
    sessionId: message.sessionId,
    requester: message.requester,
    idempotencyKey: message.idempotencyKey,
    toolName: message.toolName,
    arguments: args,
    argsDigest: message.argsDigest,
    action: message.action,
    requestReason: message.reason,
    risk: nameOf<Risk>(pb.Risk, message.risk),
    requiredApprovals: message.requiredApprovals,
    labels: { ...message.labels },
    decisions,
    resolvedBy,
    deciders,
    reason,
    rule: resolution?.rule ?? "",
    grantId: resolution?.grantId ?? "",
    scope,
    edited,
    editedArguments,
    editedArgsDigest: message.editedArgsDigest,
    editor: deciderOf(message.editor),
    argumentsToRun: edited ? editedArguments : args,
    currentArgsDigest: edited ? message.editedArgsDigest : message.argsDigest,
    receipt: message.receipt,
    createdAt: time(message.createdAt),
    expiresAt: time(message.expiresAt),
    resolvedAt: time(message.resolvedAt),
    consumption:
      consumption === undefined
        ? undefined
        : {
            outcome: nameOf<ConsumeOutcome>(pb.ConsumeOutcome, consumption.outcome),
            detail: consumption.detail,
            consumedAt: time(consumption.consumedAt),
          },
    outcome,
  };
}

export function eventOf(message: pb.ApprovalEvent): ApprovalEvent {
  return {
    type: "event",
    seq: message.seq,
    kind: nameOf<EventKind>(pb.EventKind, message.kind) ?? "requested",
    approval: message.approval === undefined ? undefined : approvalOf(message.approval),
    decision: message.decision === undefined ? undefined : decisionOf(message.decision),
    at: time(message.at),
    detail: message.detail,
    historyId: message.historyId,
  };
}

/** The proto request for `request`; one idempotency key is generated when none is given. */
export function requestProto(request: ApprovalRequest): pb.RequestApprovalRequest {
  if (request.ttlSeconds !== undefined && !(request.ttlSeconds >= 1)) {
    throw new TypeError(`ttlSeconds must be at least 1, not ${request.ttlSeconds}`);
  }
  return create(pb.RequestApprovalRequestSchema, {
    agentId: request.agentId,
    sessionId: request.sessionId ?? "",
    requester: request.requester ?? "",
    idempotencyKey: request.idempotencyKey || crypto.randomUUID(),
    toolName: request.toolName,
    argumentsJson: JSON.stringify(request.arguments ?? {}),
    action: request.action ?? "",
    reason: request.reason ?? "",
    risk: riskProto(request.risk ?? "medium"),
    routes: (request.routes ?? []).map((route) =>
      create(pb.RouteSchema, { channel: route.channel, target: route.target ?? "" }),
    ),
    requiredApprovals: request.requiredApprovals ?? 0,
    ttlSeconds: request.ttlSeconds === undefined ? 0 : Math.floor(request.ttlSeconds),
    labels: request.labels ?? {},
  });
}
