export {
  type ApprovalPage,
  Client,
  type ConsumeOptions,
  type DecideOptions,
  type DecideResult,
  type ListOptions,
  type RequestAndWaitOptions,
  type RequestResult,
  type Signal,
  type WaitOptions,
} from "./client.js";
export type { ClientOptions } from "./connection.js";
export * from "./errors.js";
export type {
  Approval,
  ApprovalEvent,
  ApprovalRequest,
  Arguments,
  ConsumeOutcome,
  Consumption,
  DecideOutcome,
  Decider,
  Decision,
  EventKind,
  ResolvedBy,
  Risk,
  Scope,
  Snapshot,
  State,
  Verdict,
} from "./model.js";
export {
  argsDigest,
  canonicalJson,
  KeySet,
  parseStrict,
  ReceiptError,
  type ReceiptExpectations,
  StrictJsonError,
  verifyReceipt,
} from "./receipts.js";
export { Watch, type WatchOptions } from "./watch.js";
