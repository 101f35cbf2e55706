// The countersign client: gRPC over HTTP/2 with connect-node, typed errors, waits that survive
// server restarts, and an AbortSignal on every call.
import { create } from "@bufbuild/protobuf";
import { type CallOptions, type Client as ConnectClient, createClient } from "@connectrpc/connect";
import { Backoff, sleep } from "./backoff.js";
import { type ClientOptions, type Connection, connectionOf, transportOf } from "./connection.js";
import { AlreadyResolved, CountersignError, errorOf, RateLimited } from "./errors.js";
import * as pb from "./gen/countersign/v1/approval_pb.js";
import {
  type Approval,
  type ApprovalRequest,
  type Arguments,
  approvalOf,
  type ConsumeOutcome,
  consumeOutcomeProto,
  type DecideOutcome,
  type Decider,
  decideOutcomeOf,
  requestProto,
  type Scope,
  type State,
  scopeProto,
  stateProto,
  type Verdict,
  verdictProto,
} from "./model.js";
import { argsDigest, headerKid, KeySet, verifyReceipt } from "./receipts.js";
import { Watch, type WatchOptions } from "./watch.js";

/** How long a long-poll may exceed the wait it asked for before the client gives up on the
 * connection: covers the round trip and a busy server. */
const WAIT_GRACE_MS = 5_000;
/** The longest pause between retries of a wait. */
const RETRY_MAX_BACKOFF_MS = 2_000;
/** A long-poll answered "still pending" sooner than this (and sooner than asked) was cut
 * short, e.g. by a server shutting down; the next one waits a backoff delay so as not to spin. */
const EARLY_RETURN_MS = 1_000;
/** Without a deadline of its own a wait lasts until the approval's expiry plus this (the
 * server's sweeper marks it EXPIRED within its sweep interval). */
const EXPIRY_GRACE_MS = 10_000;
/** The longest long-poll the proto can ask for. */
const MAX_WAIT_MS = 2 ** 32 - 1;

/** Every call takes an AbortSignal: an abort ends the call (and any retrying) with `Aborted`. */
export interface Signal {
  signal?: AbortSignal;
}

export interface WaitOptions extends Signal {
  /** How long to keep waiting, in milliseconds. Default: until the approval's own expiry. */
  deadlineMs?: number;
}

export interface RequestAndWaitOptions extends WaitOptions {
  /** How long to keep resending a RequestApproval that failed transiently (the server down
   * or restarting). Default: the deadline, or the request's TTL, or one hour. */
  requestRetryMs?: number;
}

export interface DecideOptions extends Signal {
  verdict: Verdict;
  decider: Decider;
  /** Default "once". */
  scope?: Scope;
  reason?: string;
  /** The platform's id for this action; a repeat is "duplicate". Generated when empty. */
  idempotencyKey?: string;
  /** Edit-on-approve: the arguments to run instead. */
  editedArguments?: Arguments;
  /** The args digest of the version the decider saw. */
  expectedArgsDigest?: string;
}

export interface ListOptions extends Signal {
  states?: State[];
  agentId?: string;
  channel?: string;
  sessionId?: string;
  toolName?: string;
  pageSize?: number;
  pageToken?: string;
}

export interface ConsumeOptions extends Signal {
  /** Default "succeeded". */
  outcome?: ConsumeOutcome;
  detail?: string;
  /** The digest of the arguments that ran (Approval.currentArgsDigest). */
  argsDigest?: string;
}

export interface RequestResult {
  approval: Approval;
  /** False when this was an idempotent repeat of an earlier request. */
  created: boolean;
}

export interface DecideResult {
  outcome: DecideOutcome;
  approval: Approval;
}

export interface ApprovalPage {
  approvals: Approval[];
  /** Pass as `pageToken` for the next page; "" on the last page. */
  nextPageToken: string;
}

/** The options the environment gives (the names the CLI and the Python client read). */
function environmentOptions(): ClientOptions {
  const env = process.env;
  return definedOnly({
    address: env.COUNTERSIGN_ADDRESS || env.COUNTERSIGN_SERVER || undefined,
    token: env.COUNTERSIGN_TOKEN || undefined,
    caFile: env.COUNTERSIGN_CA_FILE || env.COUNTERSIGN_CA_CERT || undefined,
  });
}

/** `options` over the environment's; a `ca` given replaces the environment's CA file. */
function withEnvironment(options: ClientOptions): ClientOptions {
  const merged = { ...environmentOptions(), ...definedOnly(options) };
  if (options.ca !== undefined && options.caFile === undefined) {
    delete merged.caFile;
  }
  return merged;
}

/** The options that are set: an explicit `undefined` does not hide the environment's value. */
function definedOnly(options: ClientOptions): ClientOptions {
  return Object.fromEntries(
    Object.entries(options).filter(([, value]) => value !== undefined),
  ) as ClientOptions;
}

/** A connection to a countersign server. */
export class Client {
  readonly connection: Connection;
  private readonly stub: ConnectClient<typeof pb.ApprovalService>;
  private readonly receiptPin: string | undefined;
  private keys: KeySet | undefined;

  /** Without an `address`, the server, token and CA come from the environment as in
   * {@link Client.fromEnv}, each overridden by the options given. */
  constructor(options: ClientOptions = {}) {
    this.connection = connectionOf(
      options.address === undefined ? withEnvironment(options) : options,
    );
    this.stub = createClient(pb.ApprovalService, transportOf(this.connection));
    this.receiptPin = options.receiptPin || undefined;
  }

  /** The server's receipt keys: the JWKS document and its fingerprint. */
  async signingKeys(options: Signal = {}): Promise<{ jwks: string; fingerprint: string }> {
    const keys = await this.call(
      (o) => this.stub.getSigningKeys(create(pb.GetSigningKeysRequestSchema, {}), o),
      options.signal,
    );
    return { jwks: keys.jwksJson, fingerprint: keys.fingerprint };
  }

  /** Checks the approval's decision receipt before its call runs: signed by the pinned key set
   * (`receiptPin`), for this approval, approving `argumentsJson` (the arguments requested; an
   * approver's edit when there is one), not expired. Returns its claims; throws ReceiptError
   * naming what did not match. */
  async verifyReceipt(
    approval: Approval,
    argumentsJson: string,
    options: Signal = {},
  ): Promise<Record<string, unknown>> {
    if (this.keys === undefined || this.keys.get(headerKid(approval.receipt)) === undefined) {
      this.keys = KeySet.fromJwks((await this.signingKeys(options)).jwks, this.receiptPin);
    }
    const digest = approval.edited
      ? argsDigest(approval.editedArguments ?? {})
      : argsDigest(argumentsJson);
    return verifyReceipt(approval.receipt, this.keys, {
      approvalId: approval.id,
      argsDigest: digest,
    });
  }

  /** A client for COUNTERSIGN_ADDRESS or COUNTERSIGN_SERVER (default 127.0.0.1:50051) with
   * COUNTERSIGN_TOKEN and COUNTERSIGN_CA_FILE or COUNTERSIGN_CA_CERT when set (the names the
   * CLI and the Python client read); `overrides` win, an address among them included. */
  static fromEnv(overrides: ClientOptions = {}): Client {
    return new Client(withEnvironment(overrides));
  }

  private async call<T>(
    invoke: (options: CallOptions) => Promise<T>,
    signal: AbortSignal | undefined,
    timeoutMs = this.connection.timeoutMs,
  ): Promise<T> {
    if (signal?.aborted) {
      throw errorOf(signal.reason, signal);
    }
    try {
      return await invoke({ signal, timeoutMs });
    } catch (error) {
      throw errorOf(error, signal);
    }
  }

  /** Creates an approval, or returns the one with the same (agentId, idempotencyKey). */
  async requestApproval(request: ApprovalRequest, options: Signal = {}): Promise<RequestResult> {
    return this.send(requestProto(request), options.signal);
  }

  private async send(
    message: pb.RequestApprovalRequest,
    signal: AbortSignal | undefined,
  ): Promise<RequestResult> {
    const response = await this.call((o) => this.stub.requestApproval(message, o), signal);
    if (response.approval === undefined) {
      throw new CountersignError("the server answered RequestApproval without an approval");
    }
    return { approval: approvalOf(response.approval), created: response.created };
  }

  async getApproval(approvalId: string, options: Signal = {}): Promise<Approval> {
    const message = create(pb.GetApprovalRequestSchema, { approvalId });
    return approvalOf(await this.call((o) => this.stub.getApproval(message, o), options.signal));
  }

  /** One long-poll of at most `waitMs`: the approval when decided, or still pending. */
  async pollDecision(approvalId: string, waitMs: number, options: Signal = {}): Promise<Approval> {
    // 0 would mean "the server's maximum"; the shortest wait that still means "at most
    // waitMs" is 1 ms.
    const timeoutMs = Math.max(1, Math.min(Math.floor(waitMs), MAX_WAIT_MS));
    const message = create(pb.WaitForDecisionRequestSchema, { approvalId, timeoutMs });
    return approvalOf(
      await this.call(
        (o) => this.stub.waitForDecision(message, o),
        options.signal,
        timeoutMs + WAIT_GRACE_MS,
      ),
    );
  }

  /** Waits until the approval is resolved or the deadline passed, across server restarts and
   * dropped connections (re-attaching by id with backoff). Returns the approval as last
   * reported, maybe still pending at the deadline; throws the last error when the server
   * stayed unreachable past the deadline. Nothing turns an error or a timeout into an
   * approval. */
  async waitForDecision(approvalId: string, options: WaitOptions = {}): Promise<Approval> {
    const started = performance.now();
    let deadlineAt: number;
    if (options.deadlineMs !== undefined) {
      deadlineAt = started + options.deadlineMs;
    } else {
      deadlineAt = deadlineOf(await this.getApproval(approvalId, options));
    }
    return this.waitUntil(approvalId, deadlineAt, options.signal);
  }

  private async waitUntil(
    approvalId: string,
    deadlineAt: number,
    signal: AbortSignal | undefined,
  ): Promise<Approval> {
    const backoff = new Backoff(RETRY_MAX_BACKOFF_MS);
    for (;;) {
      const started = performance.now();
      const remaining = Math.max(0, deadlineAt - started);
      let approval: Approval;
      try {
        approval = await this.pollDecision(approvalId, remaining, { signal });
      } catch (error) {
        if (!(error as CountersignError).transient || performance.now() >= deadlineAt) {
          throw error;
        }
        await sleep(backoff.pauseUntil(deadlineAt), signal);
        continue;
      }
      if (!approval.pending || performance.now() >= deadlineAt) {
        return approval;
      }
      if (performance.now() - started < Math.min(remaining, EARLY_RETURN_MS)) {
        await sleep(backoff.pauseUntil(deadlineAt), signal);
      } else {
        backoff.reset();
      }
    }
  }

  /** Requests an approval, then waits for its decision (see waitForDecision). A request that
   * failed transiently is resent with the same idempotency key, so the server never creates
   * a second approval. An approval is returned only when its decision receipt verifies
   * (verifyReceipt); otherwise ReceiptError. */
  async requestAndWait(
    request: ApprovalRequest,
    options: RequestAndWaitOptions = {},
  ): Promise<Approval> {
    const message = requestProto(request);
    const { signal } = options;
    const started = performance.now();
    const retryFor =
      options.requestRetryMs ?? options.deadlineMs ?? (message.ttlSeconds || 3600) * 1000;
    const backoff = new Backoff(RETRY_MAX_BACKOFF_MS);
    let approval: Approval;
    for (;;) {
      try {
        approval = (await this.send(message, signal)).approval;
        break;
      } catch (error) {
        const limit = started + retryFor;
        // A rate limit says when the call fits: wait for it rather than fail.
        if (error instanceof RateLimited && performance.now() + error.retryAfterMs < limit) {
          await sleep(error.retryAfterMs, signal);
          continue;
        }
        if (!(error as CountersignError).transient || performance.now() >= limit) {
          throw error;
        }
        await sleep(backoff.pauseUntil(limit), signal);
      }
    }
    if (approval.pending) {
      const deadlineAt =
        options.deadlineMs === undefined ? deadlineOf(approval) : started + options.deadlineMs;
      approval = await this.waitUntil(approval.id, deadlineAt, signal);
    }
    if (approval.approved) {
      await this.verifyReceipt(approval, message.argumentsJson, options);
    }
    return approval;
  }

  /** A page of approvals, newest first. */
  async list(options: ListOptions = {}): Promise<ApprovalPage> {
    const message = create(pb.ListApprovalsRequestSchema, {
      states: (options.states ?? []).map(stateProto),
      agentId: options.agentId ?? "",
      channel: options.channel ?? "",
      sessionId: options.sessionId ?? "",
      toolName: options.toolName ?? "",
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
    });
    const response = await this.call((o) => this.stub.listApprovals(message, o), options.signal);
    return { approvals: response.approvals.map(approvalOf), nextPageToken: response.nextPageToken };
  }

  /** Withdraws a pending approval. */
  async cancel(approvalId: string, options: Signal & { reason?: string } = {}): Promise<Approval> {
    const message = create(pb.CancelApprovalRequestSchema, {
      approvalId,
      reason: options.reason ?? "",
    });
    return approvalOf(await this.call((o) => this.stub.cancelApproval(message, o), options.signal));
  }

  /** Records that an approved call ran (or failed, or was handed off), once. */
  async consume(approvalId: string, options: ConsumeOptions = {}): Promise<Approval> {
    const message = create(pb.ConsumeRequestSchema, {
      approvalId,
      outcome: consumeOutcomeProto(options.outcome ?? "succeeded"),
      detail: options.detail ?? "",
      argsDigest: options.argsDigest ?? "",
    });
    return approvalOf(await this.call((o) => this.stub.consume(message, o), options.signal));
  }

  /** Decides, as a worker does. A decision that came too late throws AlreadyResolved, which
   * carries the approval showing who or what won. */
  async decide(approvalId: string, options: DecideOptions): Promise<DecideResult> {
    const message = create(pb.DecideRequestSchema, {
      approvalId,
      verdict: verdictProto(options.verdict),
      scope: scopeProto(options.scope ?? "once"),
      reason: options.reason ?? "",
      decider: create(pb.DeciderSchema, {
        channel: options.decider.channel,
        userId: options.decider.userId,
        displayName: options.decider.displayName ?? "",
      }),
      // The platform's id for this action makes a repeat DUPLICATE; without one, each call is
      // a new action.
      idempotencyKey: options.idempotencyKey || crypto.randomUUID(),
      editedArgumentsJson:
        options.editedArguments === undefined ? "" : JSON.stringify(options.editedArguments),
      expectedArgsDigest: options.expectedArgsDigest ?? "",
    });
    const response = await this.call((o) => this.stub.decide(message, o), options.signal);
    if (response.approval === undefined) {
      throw new CountersignError("the server answered Decide without an approval");
    }
    const approval = approvalOf(response.approval);
    const outcome = decideOutcomeOf(response.outcome);
    if (outcome === "already_resolved") {
      throw new AlreadyResolved(approval);
    }
    return { outcome: outcome ?? "recorded", approval };
  }

  /** Watches the approvals: an async iterator of snapshots and events that reconnects on its
   * own and resumes after the last seq it delivered (see Watch). */
  watch(options: WatchOptions = {}): Watch {
    return new Watch(this.connection, options);
  }
}

/** When a wait without a deadline of its own gives up: the approval's expiry plus a grace. */
function deadlineOf(approval: Approval): number {
  if (approval.expiresAt === undefined) {
    throw new CountersignError("the approval carries no expiry; pass deadlineMs");
  }
  const remaining = approval.expiresAt.getTime() - Date.now();
  return performance.now() + Math.max(remaining, 0) + EXPIRY_GRACE_MS;
}
