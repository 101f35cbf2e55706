// Bearer tokens and TLS, as the other clients use them.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  Client,
  PermissionDenied,
  RateLimited,
  Unauthenticated,
  Unavailable,
} from "../src/index.js";
import { AGENT_TOKEN, ALICE, Server, TOKEN_ENV, TOKENS, WORKER_TOKEN } from "./support.js";

describe("tokens", () => {
  let server: Server;
  before(async () => {
    server = await Server.start(TOKENS, TOKEN_ENV);
  });
  after(() => server.kill());

  test("a valid token is accepted and scoped to its agents", async () => {
    const agent = server.client({ token: AGENT_TOKEN });
    const worker = server.client({ token: WORKER_TOKEN });
    const { approval } = await agent.requestApproval({ agentId: "coder-1", toolName: "bash" });
    await assert.rejects(
      agent.requestApproval({ agentId: "other", toolName: "bash" }),
      PermissionDenied,
    );
    await assert.rejects(
      agent.decide(approval.id, { verdict: "approve", decider: ALICE }),
      PermissionDenied,
    );
    const decided = await worker.decide(approval.id, { verdict: "approve", decider: ALICE });
    assert.equal(decided.outcome, "resolved");
  });

  test("a watch the token may not open throws, without retrying", async () => {
    const watch = server.client({ token: AGENT_TOKEN }).watch();
    await assert.rejects(async () => {
      for await (const _ of watch) {
        assert.fail("an agent token watched");
      }
    }, PermissionDenied);
    assert.equal(watch.reconnects, 0);
  });

  test("new Client() without an address takes the server and token from the environment", async () => {
    const saved = { ...process.env };
    try {
      process.env.COUNTERSIGN_ADDRESS = server.address;
      process.env.COUNTERSIGN_TOKEN = AGENT_TOKEN;
      const fromEnvironment = new Client();
      const { approval } = await fromEnvironment.requestApproval({
        agentId: "coder-1",
        toolName: "bash",
      });
      assert.equal(approval.state, "pending");
      // An option given wins over the environment's value.
      await assert.rejects(
        new Client({ token: "wrong-token-0123456789" }).getApproval(approval.id),
        Unauthenticated,
      );
      // An address given means exactly the options given: no token from the environment.
      await assert.rejects(
        new Client({ address: server.address }).getApproval(approval.id),
        Unauthenticated,
      );
    } finally {
      process.env = saved;
    }
  });

  test("a missing or wrong token is Unauthenticated", async () => {
    for (const token of [undefined, "wrong-token-0123456789"]) {
      await assert.rejects(
        server.client({ token }).requestApproval({ agentId: "coder-1", toolName: "bash" }),
        Unauthenticated,
      );
    }
  });
});

/** A CA and a server certificate it signs for 127.0.0.1 and localhost, made with openssl. */
function certificates(): { ca: string; cert: string; key: string } {
  const dir = mkdtempSync(join(tmpdir(), "countersign-tls-"));
  const at = (name: string) => join(dir, name);
  const run = (...args: string[]) => execFileSync("openssl", args, { stdio: "ignore" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  run(
    "req",
    "-x509",
    ...ec,
    "-keyout",
    at("ca.key"),
    "-out",
    at("ca.pem"),
    "-subj",
    "/CN=countersign test CA",
    "-days",
    "2",
  );
  run(
    "req",
    ...ec,
    "-keyout",
    at("server.key"),
    "-out",
    at("server.csr"),
    "-subj",
    "/CN=countersign test server",
  );
  writeFileSync(at("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  run(
    "x509",
    "-req",
    "-in",
    at("server.csr"),
    "-CA",
    at("ca.pem"),
    "-CAkey",
    at("ca.key"),
    "-CAcreateserial",
    "-out",
    at("server.pem"),
    "-days",
    "2",
    "-extfile",
    at("san.ext"),
  );
  return { ca: at("ca.pem"), cert: at("server.pem"), key: at("server.key") };
}

describe("TLS", () => {
  let server: Server;
  let files: { ca: string; cert: string; key: string };
  before(async () => {
    files = certificates();
    server = await Server.start(`[tls]\ncert_file = "${files.cert}"\nkey_file = "${files.key}"\n`);
  });
  after(() => server.kill());

  test("the CA file verifies the server", async () => {
    const client = server.client({ caFile: files.ca });
    const { approval } = await client.requestApproval({ agentId: "tls-agent", toolName: "bash" });
    assert.equal((await client.getApproval(approval.id)).id, approval.id);
  });

  test("without the CA the server's certificate is refused; plaintext is refused", async () => {
    await assert.rejects(
      server
        .client({ address: `https://${server.address}` })
        .requestApproval({ agentId: "a", toolName: "b" }),
      (error: unknown) =>
        error instanceof Unavailable || (error as Error).message.includes("certificate"),
    );
    await assert.rejects(
      server
        .client()
        .requestApproval({ agentId: "a", toolName: "b" }, { signal: AbortSignal.timeout(5000) }),
    );
  });
});

describe("rate limits", () => {
  let server: Server;
  before(async () => {
    // One call at once, then one every 2 s.
    server = await Server.start("[limits]\nrequests_per_minute = 30\nrequest_burst = 1\n");
  });
  after(() => server.kill());

  test("requestAndWait waits out a rate limit within its deadline, then is asked", async () => {
    const client = server.client();
    await client.requestApproval({ agentId: "fast", toolName: "bash" });
    await assert.rejects(
      client.requestApproval({ agentId: "fast", toolName: "bash" }),
      RateLimited,
    );
    const approval = await client.requestAndWait(
      { agentId: "fast", toolName: "bash" },
      { deadlineMs: 5_000 },
    );
    assert.equal(approval.state, "pending", "requested once the limit allowed it; nobody decided");
  });
});
