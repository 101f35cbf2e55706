// A resumable watch: snapshot, then every event once and in order, across reconnects.
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { Backoff, sleep } from "./backoff.js";
import { type Connection, transportOf } from "./connection.js";
import { Aborted, type CountersignError, errorOf, OutOfRange, RpcError } from "./errors.js";
import * as pb from "./gen/countersign/v1/approval_pb.js";
import { type Approval, type ApprovalEvent, approvalOf, eventOf, type Snapshot } from "./model.js";

export interface WatchOptions {
  /** The last seq processed (0: only what happens from now on, or from the snapshot). */
  afterSeq?: bigint;
  /** The history id of the event log `afterSeq` was read from (an item's `historyId`). The
   * server answers a cursor of another history (the log was restored since) like one ahead
   * of the log, and the watch re-lists with a snapshot. Undefined: not checked. */
  historyId?: string;
  /** First a snapshot of the pending approvals. Default true. */
  includeSnapshot?: boolean;
  /** Only approvals routed to this channel (and those with no routes). "": all. */
  channel?: string;
  /** A stream silent longer than this is reconnected (the server sends heartbeats). 30 s. */
  heartbeatTimeoutMs?: number;
  /** The longest pause between reconnects. 10 s. */
  maxBackoffMs?: number;
  /** Ends the watch: the iterator finishes (no error). */
  signal?: AbortSignal;
}

/** Status codes retrying cannot fix. */
const FATAL = new Set([
  Code.Unauthenticated,
  Code.PermissionDenied,
  Code.InvalidArgument,
  Code.Unimplemented,
]);

/** `for await (const item of client.watch())`: Snapshot and ApprovalEvent items. It reconnects
 * after a broken connection, a server restart, a slow-consumer cut-off or a stream silent
 * beyond the heartbeat timeout, and resumes after the last seq it delivered, skipping nothing
 * and repeating nothing; when the server cannot resume from that seq (no longer retained, or
 * of another history of the log after a restore) it yields a new Snapshot. It
 * throws only what retrying cannot fix (Unauthenticated, PermissionDenied, InvalidArgument). */
export class Watch implements AsyncIterable<Snapshot | ApprovalEvent> {
  /** The seq of the last delivered event (or snapshot head, or heartbeat): the seq to store
   * to resume later. Undefined until the watch has a gap-free position. */
  cursor: bigint | undefined;
  /** The history id of the event log `cursor` belongs to: store it with the seq. */
  historyId: string;
  /** Streams opened after the first one. */
  reconnects = 0;
  private readonly backoff: Backoff;

  constructor(
    private readonly connection: Connection,
    private readonly options: WatchOptions,
  ) {
    this.cursor = options.afterSeq || undefined;
    this.historyId = options.historyId ?? "";
    this.backoff = new Backoff(options.maxBackoffMs ?? 10_000);
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Snapshot | ApprovalEvent> {
    const { signal } = this.options;
    let first = true;
    let delayMs = 0;
    while (!signal?.aborted) {
      try {
        await sleep(delayMs, signal);
      } catch (error) {
        if (error instanceof Aborted) {
          return;
        }
        throw error;
      }
      const request = this.request(first);
      first = false;
      const outcome = yield* this.stream(request);
      if (outcome === "aborted") {
        return;
      }
      delayMs = this.backoff.nextDelayMs();
    }
  }

  private request(first: boolean): pb.WatchApprovalsRequest {
    let afterSeq: bigint;
    let includeSnapshot: boolean;
    if (first) {
      afterSeq = this.options.afterSeq ?? 0n;
      includeSnapshot = this.options.includeSnapshot ?? true;
    } else {
      this.reconnects += 1;
      // after_seq 0 means "from now on", not "from the beginning": without a cursor the
      // watch cannot resume without a gap, so it takes a snapshot instead.
      afterSeq = this.cursor ?? 0n;
      includeSnapshot = afterSeq === 0n;
    }
    return create(pb.WatchApprovalsRequestSchema, {
      afterSeq,
      channel: this.options.channel ?? "",
      includeSnapshot,
      historyId: afterSeq === 0n ? "" : this.historyId,
    });
  }

  /** One stream, on a fresh connection (the old one may be dead without knowing it). Returns
   * how it ended; throws the fatal errors. */
  private async *stream(
    request: pb.WatchApprovalsRequest,
  ): AsyncGenerator<Snapshot | ApprovalEvent, "ended" | "aborted"> {
    const { signal } = this.options;
    const silent = new AbortController();
    const heartbeatTimeoutMs = this.options.heartbeatTimeoutMs ?? 30_000;
    let timer = setTimeout(() => silent.abort("silent"), heartbeatTimeoutMs);
    const streamSignal = signal ? AbortSignal.any([signal, silent.signal]) : silent.signal;
    const stub = createClient(pb.ApprovalService, transportOf(this.connection));
    let snapshot: Approval[] = [];
    try {
      for await (const message of stub.watchApprovals(request, { signal: streamSignal })) {
        clearTimeout(timer);
        timer = setTimeout(() => silent.abort("silent"), heartbeatTimeoutMs);
        this.backoff.reset();
        if (this.historyId === "") {
          // Resumed without a history id (not checked): the stream's is the one to resume with.
          this.historyId = message.historyId;
        }
        switch (message.kind) {
          case pb.EventKind.SNAPSHOT:
            if (message.approval !== undefined) {
              snapshot.push(approvalOf(message.approval));
            }
            break;
          case pb.EventKind.SNAPSHOT_COMPLETE: {
            this.cursor = message.seq;
            this.historyId = message.historyId;
            const approvals = snapshot;
            snapshot = [];
            yield {
              type: "snapshot",
              approvals,
              headSeq: message.seq,
              historyId: message.historyId,
            };
            break;
          }
          case pb.EventKind.HEARTBEAT:
            // The server has examined everything up to this seq for this stream: a safe
            // cursor even when none of it was for our channel.
            if (message.seq > (this.cursor ?? 0n)) {
              this.cursor = message.seq;
            }
            break;
          default:
            if (this.cursor !== undefined && message.seq <= this.cursor) {
              break; // already delivered before a reconnect
            }
            this.cursor = message.seq;
            yield eventOf(message);
        }
      }
      return "ended";
    } catch (thrown) {
      if (signal?.aborted) {
        return "aborted";
      }
      if (silent.signal.aborted) {
        return "ended"; // silent beyond the heartbeat timeout: reconnect
      }
      const error: CountersignError = errorOf(thrown);
      if (error instanceof RpcError && FATAL.has(error.code)) {
        throw error;
      }
      if (error instanceof OutOfRange) {
        this.cursor = undefined; // resync with a snapshot
      }
      return "ended";
    } finally {
      clearTimeout(timer);
    }
  }
}
