// Decision receipts (docs/security.md#decision-receipts): the arguments' digest computed here
// is the server's, an approval comes back only with a receipt that verifies for the call
// asked, altered receipts are refused, and a man in the middle cannot turn a rejection into
// an approval.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer, type Socket, connect as tcpConnect } from "node:net";
import { join } from "node:path";
import { describe, test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { connectionOf, transportOf } from "../src/connection.js";
import * as pb from "../src/gen/countersign/v1/approval_pb.js";
import {
  type Approval,
  argsDigest,
  type Client,
  KeySet,
  ReceiptError,
  verifyReceipt,
} from "../src/index.js";
import { agentId, decideNext, SERVER_BIN, Server, sharedServer } from "./support.js";

// Texts whose canonical form is tricky: unicode (escaped and not, above U+FFFF, controls),
// numbers (fractions that are integers, exponents, -0, the 64-bit edges, the smallest double),
// nested keys whose code point order differs from UTF-16's.
const TRICKY = [
  '{"note": "caf\\u00e9 \\ud83d\\ude80 \\u001f \\u007f \\"q\\" \\\\ /", "emoji": "🚀"}',
  '{"n": [1.0, 1e3, -0, -0.0, 1e21, 1e-7, 0.000001, 123456789012345678, 5e-324, 1.7976931348623157e308]}',
  '{"edges": [9223372036854775807, -9223372036854775808, 18446744073709551615, 0.1, 100.5e-2]}',
  '{"z": {"\\ue000": 1, "\\ud83d\\ude00": 2, "a": {"B": 1, "a": [], "": null}}, "A": true, "é": false}',
];

const ARGS = { env: "prod", note: "café" };

/** requestAndWait through `client`, decided `verdict` by Alice on `direct`. */
async function decided(
  client: Client,
  direct: Client,
  verdict: "approve" | "reject",
): Promise<Approval> {
  const agent = agentId();
  const decision = decideNext(direct, agent, { verdict, reason: "ok" });
  const approval = client.requestAndWait(
    { agentId: agent, toolName: "deploy", arguments: ARGS, action: "deploy", risk: "high" },
    { deadlineMs: 20_000 },
  );
  const [settled] = await Promise.allSettled([approval, decision]);
  if (settled.status === "rejected") throw settled.reason;
  return settled.value;
}

/** A TCP proxy that passes the client's bytes and replaces `from` with `to` in the server's. */
async function rewritingProxy(target: string, from: Buffer, to: Buffer) {
  const [host, port] = target.split(":") as [string, string];
  const counter = { rewrites: 0, address: "" };
  const proxy = createServer((inbound: Socket) => {
    const outbound = tcpConnect(Number(port), host);
    inbound.pipe(outbound);
    outbound.on("data", (chunk: Buffer) => {
      let at = chunk.indexOf(from);
      while (at >= 0) {
        to.copy(chunk, at);
        counter.rewrites += 1;
        at = chunk.indexOf(from, at + from.length);
      }
      inbound.write(chunk);
    });
    outbound.on("end", () => inbound.end());
    outbound.on("error", () => inbound.destroy());
    inbound.on("error", () => outbound.destroy());
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  const address = proxy.address();
  counter.address = typeof address === "object" && address ? `127.0.0.1:${address.port}` : "";
  return { counter, close: () => proxy.close() };
}

function withClaim(receipt: string, name: string, value: string): string {
  const [header, payload, signature] = receipt.split(".") as [string, string, string];
  const claims = JSON.parse(Buffer.from(payload, "base64url").toString());
  claims[name] = value;
  return `${header}.${Buffer.from(JSON.stringify(claims)).toString("base64url")}.${signature}`;
}

describe("receipts", () => {
  const shared = sharedServer();

  test("the digest computed here is the server's, on tricky inputs", async () => {
    const stub = createClient(
      pb.ApprovalService,
      transportOf(connectionOf({ address: shared.server.address })),
    );
    const agent = agentId();
    for (const [index, text] of TRICKY.entries()) {
      const response = await stub.requestApproval(
        create(pb.RequestApprovalRequestSchema, {
          agentId: agent,
          idempotencyKey: `call-${index}`,
          toolName: "deploy",
          argumentsJson: text,
          action: "x",
          risk: pb.Risk.HIGH,
        }),
      );
      assert.equal(argsDigest(text), response.approval?.argsDigest, text);
    }
  });

  test("an approval comes back only with a receipt that verifies under the pin", async () => {
    const { fingerprint } = await shared.client.signingKeys();
    const pinned = shared.server.client({ receiptPin: fingerprint });
    const approval = await decided(pinned, shared.client, "approve");
    assert.equal(approval.approved, true);
    const claims = await pinned.verifyReceipt(approval, JSON.stringify(ARGS));
    assert.equal(claims.approval_id, approval.id);
    assert.equal(claims.args_digest, approval.argsDigest);
    const other = shared.server.client({
      receiptPin: "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k",
    });
    await assert.rejects(decided(other, shared.client, "approve"), (error: Error) => {
      assert.ok(error instanceof ReceiptError);
      assert.match(error.message, /the key set's fingerprint is .*, not the pinned kPrK_/);
      return true;
    });
  });

  test("altered receipts are refused, naming what did not match", async () => {
    const first = await decided(shared.client, shared.client, "approve");
    const second = await decided(shared.client, shared.client, "approve");
    const keys = KeySet.fromJwks((await shared.client.signingKeys()).jwks);
    const expected = { approvalId: first.id, argsDigest: first.argsDigest };
    verifyReceipt(first.receipt, keys, expected);
    for (const [name, value] of [
      ["args_digest", "0".repeat(64)],
      ["verdict", "REJECT"],
      ["approval_id", second.id],
    ] as const) {
      assert.throws(
        () => verifyReceipt(withClaim(first.receipt, name, value), keys, expected),
        /signature does not verify/,
      );
    }
    const [header, payload, signature] = first.receipt.split(".") as [string, string, string];
    const flipped = `${signature.slice(0, 4)}${signature[4] === "A" ? "B" : "A"}${signature.slice(5)}`;
    assert.throws(
      () => verifyReceipt(`${header}.${payload}.${flipped}`, keys, expected),
      /signature does not verify/,
    );
    assert.throws(
      () => verifyReceipt(first.receipt, keys, { ...expected, approvalId: second.id }),
      new RegExp(`is for approval ${first.id}, not ${second.id}`),
    );
    assert.throws(
      () =>
        verifyReceipt(first.receipt, keys, { ...expected, argsDigest: argsDigest({ env: "dev" }) }),
      /approves arguments with digest/,
    );
    assert.throws(
      () => verifyReceipt(first.receipt, keys, { ...expected, nowMs: 2 ** 50 }),
      /expired at/,
    );
  });

  test("a rejection a man in the middle turned into an approval is refused", async () => {
    // Approval.state (field 15): REJECTED (3) becomes APPROVED (2).
    const proxy = await rewritingProxy(
      shared.server.address,
      Buffer.from([0x78, 0x03]),
      Buffer.from([0x78, 0x02]),
    );
    try {
      const through = shared.server.client({ address: proxy.counter.address });
      await assert.rejects(decided(through, shared.client, "reject"), (error: Error) => {
        assert.ok(error instanceof ReceiptError, String(error));
        assert.match(error.message, /verdict is REJECT, not APPROVE/);
        return true;
      });
      assert.ok(proxy.counter.rewrites > 0);
    } finally {
      proxy.close();
    }
  });

  test("a rotation keeps old receipts verifiable and the fingerprint", async () => {
    const server = await Server.start();
    try {
      const client = server.client();
      const old = await decided(client, client, "approve");
      const before = await client.signingKeys();
      await server.kill();
      const rotated = execFileSync(SERVER_BIN, [
        "--config",
        join(server.dir, "countersign.toml"),
        "--database",
        join(server.dir, "countersign.db"),
        "keys",
        "rotate",
      ]);
      assert.equal(JSON.parse(rotated.toString()).retired_kid, before.fingerprint);
      await server.start();
      const pinned = server.client({ receiptPin: before.fingerprint });
      const fresh = await decided(pinned, client, "approve");
      const keys = KeySet.fromJwks((await pinned.signingKeys()).jwks, before.fingerprint);
      assert.equal(keys.keys.length, 2);
      assert.equal(verifyReceipt(old.receipt, keys).approval_id, old.id);
      assert.equal(verifyReceipt(fresh.receipt, keys).approval_id, fresh.id);
      assert.throws(
        () => verifyReceipt(fresh.receipt, KeySet.fromJwks(before.jwks)),
        /not in the pinned key set/,
      );
    } finally {
      await server.kill();
    }
  });
});
