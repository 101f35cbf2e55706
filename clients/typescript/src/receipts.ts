// Decision receipts: checking, before a call runs, that the server signed its approval of
// exactly that call (docs/security.md#decision-receipts). A receipt is a compact JWS (EdDSA
// over Ed25519, RFC 8037) whose header and claims are countersign's canonical JSON; it
// verifies when a key of the server's key set signed it, the set chains to the pinned
// fingerprint (its first key's RFC 7638 thumbprint; each later key endorsed by the one
// before), and its claims approve this approval, for the digest of the arguments about to
// run, before `exp`. The digest is computed exactly as the server does (canonicalJson).
import { createHash, createPublicKey, type KeyObject, verify } from "node:crypto";
import { CountersignError } from "./errors.js";

export const RECEIPT_TYPE = "countersign-receipt+jwt";
export const ENDORSEMENT_TYPE = "countersign-key+jwt";

/** The decision receipt does not verify: the call must not run. The message names what did
 * not match (signature, key, approval id, arguments digest, verdict, expiry). */
export class ReceiptError extends CountersignError {
  constructor(message: string) {
    super(`the decision receipt does not verify: ${message}`);
  }
}

/** Arguments with more than one meaning: a key twice, a number that cannot be held exactly. */
export class StrictJsonError extends CountersignError {}

/** A JSON value as the server reads it: integers exact (bigint), other numbers doubles. */
export type StrictJson =
  | null
  | boolean
  | number
  | bigint
  | string
  | StrictJson[]
  | { [key: string]: StrictJson };

const I64_MIN = -(2n ** 63n);
const U64_MAX = 2n ** 64n - 1n;

/** Parses JSON as the server does: a key twice in one object, an integer beyond 64 bits or a
 * number beyond the double range is refused; integers come back as bigints. */
export function parseStrict(text: string): StrictJson {
  let at = 0;
  const fail = (why: string): never => {
    throw new StrictJsonError(`${why} at character ${at}`);
  };
  const space = () => {
    while (at < text.length && " \t\n\r".includes(text[at] as string)) at++;
  };
  const value = (): StrictJson => {
    space();
    const c = text[at];
    if (c === "{") {
      at++;
      const object: { [key: string]: StrictJson } = Object.create(null);
      space();
      if (text[at] === "}") {
        at++;
        return object;
      }
      for (;;) {
        space();
        if (text[at] !== '"') fail("expected a key");
        const key = string();
        if (Object.hasOwn(object, key)) {
          fail(
            `the key ${JSON.stringify(key)} appears twice; parsers disagree on which value counts`,
          );
        }
        space();
        if (text[at++] !== ":") fail("expected ':'");
        object[key] = value();
        space();
        const next = text[at++];
        if (next === "}") return object;
        if (next !== ",") fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      at++;
      const items: StrictJson[] = [];
      space();
      if (text[at] === "]") {
        at++;
        return items;
      }
      for (;;) {
        items.push(value());
        space();
        const next = text[at++];
        if (next === "]") return items;
        if (next !== ",") fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    for (const [word, meaning] of [
      ["true", true],
      ["false", false],
      ["null", null],
    ] as const) {
      if (text.startsWith(word, at)) {
        at += word.length;
        return meaning;
      }
    }
    const literal = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(at))?.[0];
    if (!literal) return fail("not JSON");
    at += literal.length;
    if (!/[.eE]/.test(literal)) {
      const integer = BigInt(literal);
      if (integer < I64_MIN || integer > U64_MAX) {
        fail(`the integer ${literal} does not fit in 64 bits; send it as a string`);
      }
      return integer;
    }
    const number = Number(literal);
    if (!Number.isFinite(number)) {
      fail(`the number ${literal} is beyond the range of a double; send it as a string`);
    }
    return number;
  };
  const string = (): string => {
    let end = at + 1;
    while (end < text.length && text[end] !== '"') {
      end += text[end] === "\\" ? 2 : 1;
    }
    const literal = text.slice(at, end + 1);
    at = end + 1;
    try {
      // JSON.parse refuses what a JSON string may not hold (raw control characters, bad escapes).
      return JSON.parse(literal) as string;
    } catch {
      return fail("not a JSON string");
    }
  };
  const parsed = value();
  space();
  if (at !== text.length) fail("trailing characters");
  return parsed;
}

const utf8 = (text: string) => Buffer.from(text, "utf8");

/** countersign's canonical JSON (docs/security.md#one-meaning-per-call): keys sorted by code
 * point, no insignificant whitespace, strings escaped as RFC 8785 does, integers exact,
 * other numbers in ECMAScript's shortest form. */
export function canonicalJson(value: unknown): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "bigint":
      return value.toString();
    case "number":
      if (!Number.isFinite(value)) throw new StrictJsonError("a number must be finite");
      return String(value); // ECMAScript's own Number.prototype.toString; -0 is "0"
    case "string":
      return JSON.stringify(value);
    case "object": {
      if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
      const entries = Object.entries(value as Record<string, unknown>).filter(
        ([, item]) => item !== undefined,
      );
      // UTF-8 byte order is code point order (UTF-16 order differs above U+FFFF).
      entries.sort(([a], [b]) => Buffer.compare(utf8(a), utf8(b)));
      return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
    }
    default:
      throw new StrictJsonError(`${typeof value} is not JSON`);
  }
}

/** Hex SHA-256 of the canonical JSON of `args`: JSON text (parsed strictly) or a value. */
export function argsDigest(args: string | unknown): string {
  const value = typeof args === "string" ? parseStrict(args) : args;
  return createHash("sha256").update(canonicalJson(value), "utf8").digest("hex");
}

/** The RFC 7638 thumbprint of an Ed25519 public key given as its base64url `x`. */
export function keyId(x: string): string {
  const members = canonicalJson({ crv: "Ed25519", kty: "OKP", x });
  return createHash("sha256").update(members).digest("base64url");
}

function decodeJson(part: string, what: string): Record<string, unknown> {
  try {
    const value = JSON.parse(Buffer.from(part, "base64url").toString("utf8"));
    if (value && typeof value === "object" && !Array.isArray(value)) return value;
  } catch {
    // refused below
  }
  throw new ReceiptError(`the receipt is not a compact JWS: ${what} is not a JSON object`);
}

/** The server's public keys, oldest first, checked to be one chain of endorsements. */
export class KeySet {
  private constructor(readonly keys: ReadonlyArray<readonly [string, KeyObject]>) {}

  /** The set's fingerprint: its first key's id. */
  get fingerprint(): string {
    return this.keys[0]?.[0] ?? "";
  }

  get(kid: string): KeyObject | undefined {
    return this.keys.find(([k]) => k === kid)?.[1];
  }

  /** Reads a JWKS document; refuses a key whose kid is not its thumbprint, a key not endorsed
   * by the key before it, and (with `pin`) a set with another fingerprint. */
  static fromJwks(jwks: string | { keys?: unknown }, pin?: string): KeySet {
    const document = typeof jwks === "string" ? JSON.parse(jwks) : jwks;
    const entries = Array.isArray(document?.keys)
      ? (document.keys as Record<string, string>[])
      : [];
    if (entries.length === 0) throw new ReceiptError("the key set is not valid: no keys");
    const keys: [string, KeyObject][] = [];
    entries.forEach((jwk, index) => {
      if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || typeof jwk.x !== "string") {
        throw new ReceiptError(`the key set is not valid: key ${index} is not an Ed25519 key`);
      }
      const kid = keyId(jwk.x);
      if (jwk.kid !== kid) {
        throw new ReceiptError(
          `the key set is not valid: key ${index}'s kid is not its thumbprint ${kid}`,
        );
      }
      const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: jwk.x }, format: "jwk" });
      const before = keys.at(-1);
      if (before) {
        let endorses: unknown;
        try {
          endorses = verifyJws(
            jwk.countersign_endorsement ?? "",
            ENDORSEMENT_TYPE,
            new KeySet([before]),
          ).endorses;
        } catch {
          endorses = undefined;
        }
        if (endorses !== kid) {
          throw new ReceiptError(
            `the key set is not valid: key ${kid} is not endorsed by key ${before[0]}`,
          );
        }
      }
      keys.push([kid, key]);
    });
    const set = new KeySet(keys);
    if (pin && set.fingerprint !== pin) {
      throw new ReceiptError(
        `the key set's fingerprint is ${set.fingerprint}, not the pinned ${pin}`,
      );
    }
    return set;
  }
}

/** The key id a JWS names ("" when none). */
export function headerKid(token: string): string {
  try {
    const kid = decodeJson(token.split(".")[0] ?? "", "the header").kid;
    return typeof kid === "string" ? kid : "";
  } catch {
    return "";
  }
}

function verifyJws(token: string, typ: string, keys: KeySet): Record<string, unknown> {
  const trimmed = token.trim();
  if (!trimmed) throw new ReceiptError("the receipt is missing");
  const parts = trimmed.split(".");
  if (parts.length !== 3) {
    throw new ReceiptError(`the receipt is not a compact JWS: ${parts.length} parts, not 3`);
  }
  const [header, payload, signature] = parts as [string, string, string];
  const fields = decodeJson(header, "the header");
  const kid = typeof fields.kid === "string" ? fields.kid : "";
  if (fields.alg !== "EdDSA" || fields.typ !== typ || !kid || Object.keys(fields).length !== 3) {
    throw new ReceiptError(
      `the receipt's header is not an EdDSA ${typ} header: ${canonicalJson(fields)}`,
    );
  }
  const key = keys.get(kid);
  if (!key) {
    throw new ReceiptError(
      `the receipt is signed with key ${kid}, which is not in the pinned key set`,
    );
  }
  const signed = verify(
    null,
    Buffer.from(`${header}.${payload}`),
    key,
    Buffer.from(signature, "base64url"),
  );
  if (!signed) throw new ReceiptError(`the receipt's signature does not verify with key ${kid}`);
  return decodeJson(payload, "the payload");
}

export interface ReceiptExpectations {
  /** The approval the receipt must be about. */
  approvalId?: string;
  /** The digest of the arguments about to run: the receipt must APPROVE exactly them. */
  argsDigest?: string;
  /** Unix milliseconds; default now. */
  nowMs?: number;
}

/** The receipt's claims when its signature verifies with `keys` and it meets each expectation
 * given, and is not expired; ReceiptError names what did not match otherwise. */
export function verifyReceipt(
  receipt: string,
  keys: KeySet,
  expected: ReceiptExpectations = {},
): Record<string, unknown> {
  const claims = verifyJws(receipt, RECEIPT_TYPE, keys);
  const { approvalId, argsDigest: digest } = expected;
  if (
    approvalId !== undefined &&
    (claims.approval_id !== approvalId || claims.sub !== approvalId)
  ) {
    throw new ReceiptError(`the receipt is for approval ${claims.approval_id}, not ${approvalId}`);
  }
  if (digest !== undefined) {
    if (claims.verdict !== "APPROVE") {
      throw new ReceiptError(`the receipt's verdict is ${claims.verdict}, not APPROVE`);
    }
    if (claims.args_digest !== digest) {
      throw new ReceiptError(
        `the receipt approves arguments with digest ${claims.args_digest}, not the arguments about to run (digest ${digest})`,
      );
    }
  }
  const now = Math.floor((expected.nowMs ?? Date.now()) / 1000);
  if (typeof claims.exp !== "number" || now >= claims.exp) {
    throw new ReceiptError(`the receipt expired at ${claims.exp} (unix seconds), now is ${now}`);
  }
  return claims;
}
