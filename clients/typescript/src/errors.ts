// Typed errors. Each carries the server's own message, which names what is wrong. No error
// ever means "approved": code that gates an action acts only on an approval whose `approved`
// is true.
import { Code, ConnectError } from "@connectrpc/connect";
import type { Approval } from "./model.js";

/** Base of every error this package throws. */
export class CountersignError extends Error {
  /** The gRPC status code, when the error came from the server or the transport. */
  readonly code: Code | undefined = undefined;

  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name; // "Unavailable", "InvalidArgument", ...
  }

  /** True when the same call may succeed later (unreachable server, broken connection). */
  get transient(): boolean {
    return false;
  }
}

/** The client configuration cannot be used (address, CA, token). */
export class ConfigError extends CountersignError {}

/** The call was aborted through its AbortSignal. */
export class Aborted extends CountersignError {}

/** A gRPC status the server (or the transport) answered with. */
export class RpcError extends CountersignError {
  override readonly code: Code;

  constructor(code: Code, message: string, options?: ErrorOptions) {
    super(`${Code[code]}: ${message}`, options);
    this.code = code;
    this.rawMessage = message;
  }

  /** The server's message without the code. */
  readonly rawMessage: string;

  override get transient(): boolean {
    return TRANSIENT.has(this.code);
  }
}

/** The server could not be reached, or the connection broke. */
export class Unavailable extends RpcError {}
/** The call did not complete in time. */
export class DeadlineExceeded extends RpcError {}
/** No approval (or grant) with that id. */
export class NotFound extends RpcError {}
/** The request was refused and nothing was stored; `field` names the offending field. */
export class InvalidArgument extends RpcError {
  /** The request field the server named ("arguments_json", "ttl_seconds", ...), if any. */
  readonly field: string | undefined;

  constructor(code: Code, message: string, options?: ErrorOptions) {
    super(code, message, options);
    const colon = message.indexOf(": ");
    const field = colon > 0 ? message.slice(0, colon) : "";
    this.field = field && !field.includes(" ") ? field : undefined;
  }
}
/** The token may not do this, or the decider may not decide this approval. */
export class PermissionDenied extends RpcError {}
/** No token, or a token the server does not accept. */
export class Unauthenticated extends RpcError {}
/** An idempotency key used before with other arguments. */
export class AlreadyExists extends RpcError {}
/** The approval is not in a state that allows this (e.g. a second consume). */
export class FailedPrecondition extends RpcError {}
/** A size or pending limit, or (on a watch) a consumer too slow for the server. */
export class ResourceExhausted extends RpcError {}
/** The agent exceeded its request rate; `retryAfterMs` says when to try again. */
export class RateLimited extends ResourceExhausted {
  constructor(
    code: Code,
    message: string,
    readonly retryAfterMs: number,
    options?: ErrorOptions,
  ) {
    super(code, message, options);
  }
}
/** A watch cursor the server no longer retains (or that is ahead of it). */
export class OutOfRange extends RpcError {}

/** A decision arrived after the approval was resolved; `approval` shows who or what won. */
export class AlreadyResolved extends CountersignError {
  constructor(readonly approval: Approval) {
    super(`approval ${approval.id} was already resolved: ${approval.outcome}`);
  }
}

// A connection torn down mid-call surfaces as CANCELED ("http/2 stream closed with error code
// CANCEL" when the server is killed under a long-poll) or UNKNOWN, a server-side abort as
// ABORTED (as in the Rust and Python clients). An abort through the caller's own signal is
// Aborted, never retried.
const TRANSIENT = new Set([
  Code.Unavailable,
  Code.DeadlineExceeded,
  Code.Canceled,
  Code.Unknown,
  Code.Aborted,
]);

const BY_CODE = new Map<Code, typeof RpcError>([
  [Code.Unavailable, Unavailable],
  [Code.DeadlineExceeded, DeadlineExceeded],
  [Code.NotFound, NotFound],
  [Code.InvalidArgument, InvalidArgument],
  [Code.PermissionDenied, PermissionDenied],
  [Code.Unauthenticated, Unauthenticated],
  [Code.AlreadyExists, AlreadyExists],
  [Code.FailedPrecondition, FailedPrecondition],
  [Code.ResourceExhausted, ResourceExhausted],
  [Code.OutOfRange, OutOfRange],
]);

/** The typed error for anything a call threw; an abort through `signal` is `Aborted`. */
export function errorOf(error: unknown, signal?: AbortSignal): CountersignError {
  if (signal?.aborted) {
    return new Aborted(`aborted: ${String(signal.reason ?? "the signal was aborted")}`, {
      cause: error,
    });
  }
  if (error instanceof CountersignError) {
    return error;
  }
  const connect = ConnectError.from(error);
  const message = connect.rawMessage;
  if (connect.code === Code.ResourceExhausted) {
    const retryAfter = Number(connect.metadata.get("retry-after-ms"));
    if (connect.metadata.has("retry-after-ms") && Number.isFinite(retryAfter)) {
      return new RateLimited(connect.code, message, retryAfter, { cause: error });
    }
  }
  const Type = BY_CODE.get(connect.code) ?? RpcError;
  return new Type(connect.code, message, { cause: error });
}
