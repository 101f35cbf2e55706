// The client's whole path against the real server: every call, typed errors, waits across a
// server restart, an unreachable server, aborts, the watch.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  Aborted,
  AlreadyExists,
  AlreadyResolved,
  type ApprovalEvent,
  Client,
  ConfigError,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  type Snapshot,
  Unavailable,
} from "../src/index.js";
import {
  ALICE,
  agentId,
  decideNext,
  firstPending,
  freePort,
  SERVER_BIN,
  Server,
  sharedServer,
} from "./support.js";

describe("client", () => {
  const shared = sharedServer();

  test("requestApproval is idempotent on the idempotency key", async () => {
    const agent = agentId();
    const request = {
      agentId: agent,
      toolName: "deploy",
      arguments: { env: "prod" },
      idempotencyKey: "call-1",
    };
    const first = await shared.client.requestApproval(request);
    const again = await shared.client.requestApproval(request);
    assert.equal(first.created, true);
    assert.equal(again.created, false);
    assert.equal(again.approval.id, first.approval.id);
    assert.equal(first.approval.state, "pending");
    assert.deepEqual(first.approval.arguments, { env: "prod" });
    await assert.rejects(
      shared.client.requestApproval({ ...request, arguments: { env: "staging" } }),
      AlreadyExists,
    );
  });

  test("requestAndWait returns the approval once a person approved it", async () => {
    const agent = agentId();
    const decided = decideNext(shared.client, agent, { verdict: "approve", reason: "fine" });
    const approval = await shared.client.requestAndWait({
      agentId: agent,
      toolName: "bash",
      arguments: { command: "make clean" },
      sessionId: "s-1",
      risk: "high",
    });
    await decided;
    assert.equal(approval.approved, true);
    assert.equal(approval.sessionId, "s-1");
    assert.equal(approval.scope, "once");
    assert.equal(approval.outcome, "approved by Alice via cli: fine");
    const consumed = await shared.client.consume(approval.id, {
      argsDigest: approval.currentArgsDigest,
    });
    assert.equal(consumed.state, "consumed");
    assert.equal(consumed.consumption?.outcome, "succeeded");
    await assert.rejects(shared.client.consume(approval.id), FailedPrecondition);
  });

  test("a rejection carries who rejected and why; a late decision is AlreadyResolved", async () => {
    const agent = agentId();
    const decided = decideNext(shared.client, agent, {
      verdict: "reject",
      reason: "not on a Friday",
    });
    const approval = await shared.client.requestAndWait({ agentId: agent, toolName: "deploy" });
    await decided;
    assert.equal(approval.approved, false);
    assert.equal(approval.state, "rejected");
    assert.equal(approval.reason, "not on a Friday");
    assert.deepEqual(approval.deciders, [ALICE]);
    const late = shared.client.decide(approval.id, { verdict: "approve", decider: ALICE });
    await assert.rejects(late, (error: unknown) => {
      assert.ok(error instanceof AlreadyResolved);
      assert.equal(error.approval.state, "rejected");
      return true;
    });
  });

  test("an approval with edited arguments says what to run", async () => {
    const agent = agentId();
    const request = shared.client.requestApproval({
      agentId: agent,
      toolName: "bash",
      arguments: { command: "rm -rf ./build" },
    });
    const pending = await firstPending(shared.client, agent);
    await shared.client.decide(pending.id, {
      verdict: "approve",
      decider: ALICE,
      editedArguments: { command: "rm -rf ./build/cache" },
    });
    const approval = await shared.client.waitForDecision((await request).approval.id);
    assert.equal(approval.approved, true);
    assert.equal(approval.edited, true);
    assert.deepEqual(approval.argumentsToRun, { command: "rm -rf ./build/cache" });
    assert.deepEqual(approval.arguments, { command: "rm -rf ./build" });
    assert.notEqual(approval.currentArgsDigest, approval.argsDigest);
  });

  test("bad input is InvalidArgument naming the field; an unknown id is NotFound", async () => {
    await assert.rejects(
      shared.client.requestApproval({ agentId: "", toolName: "bash" }),
      (error: unknown) => {
        assert.ok(error instanceof InvalidArgument);
        assert.equal(error.field, "agent_id");
        return true;
      },
    );
    await assert.rejects(
      shared.client.getApproval("0190d5b4-0000-7000-8000-000000000000"),
      NotFound,
    );
    assert.throws(() => new Client({ address: "nowhere" }), ConfigError);
    assert.throws(() => new Client({ address: "ftp://h:1" }), ConfigError);
    assert.throws(() => new Client({ token: "a\nb" }), ConfigError);
  });

  test("an enum option of the wrong type from plain JavaScript names the field and its values", async () => {
    const plain = shared.client as unknown as {
      requestApproval(request: Record<string, unknown>): Promise<unknown>;
    };
    for (const risk of [2, "severe", true]) {
      await assert.rejects(
        plain.requestApproval({ agentId: agentId(), toolName: "bash", risk }),
        (error: unknown) => {
          assert.ok(error instanceof TypeError, String(error));
          assert.match(
            error.message,
            /^risk must be one of "low", "medium", "high", "critical", not /,
          );
          return true;
        },
      );
    }
  });

  test("a wait returns the approval still pending at its deadline", async () => {
    const agent = agentId();
    const approval = await shared.client.requestAndWait(
      { agentId: agent, toolName: "bash" },
      { deadlineMs: 300 },
    );
    assert.equal(approval.state, "pending");
    assert.equal(approval.approved, false);
  });

  test("an AbortSignal ends a wait with Aborted", async () => {
    const agent = agentId();
    const controller = new AbortController();
    const waiting = shared.client.requestAndWait(
      { agentId: agent, toolName: "bash" },
      { signal: controller.signal },
    );
    await firstPending(shared.client, agent);
    controller.abort("the user left");
    await assert.rejects(waiting, Aborted);
    await assert.rejects(shared.client.getApproval("x", { signal: AbortSignal.abort() }), Aborted);
  });

  test("a session approval approves the next call of the tool in the session at once", async () => {
    const agent = agentId();
    const decided = decideNext(shared.client, agent, { verdict: "approve", scope: "session" });
    const first = await shared.client.requestAndWait({
      agentId: agent,
      toolName: "bash",
      sessionId: "s",
    });
    await decided;
    assert.equal(first.scope, "session");
    const second = await shared.client.requestAndWait({
      agentId: agent,
      toolName: "bash",
      sessionId: "s",
      arguments: { command: "ls" },
    });
    assert.equal(second.approved, true);
    assert.equal(second.resolvedBy, "grant");
  });

  test("watch yields a snapshot, then each event once and in order", async () => {
    const agent = agentId();
    const pending = await shared.client.requestApproval({ agentId: agent, toolName: "deploy" });
    const controller = new AbortController();
    const watch = shared.client.watch({ signal: controller.signal });
    const items: (Snapshot | ApprovalEvent)[] = [];
    for await (const item of watch) {
      items.push(item);
      if (item.type === "snapshot") {
        assert.ok(item.approvals.some((a) => a.id === pending.approval.id));
        await shared.client.decide(pending.approval.id, { verdict: "approve", decider: ALICE });
      } else if (item.kind === "resolved" && item.approval?.id === pending.approval.id) {
        controller.abort();
      }
    }
    const kinds = items.map((item) => (item.type === "snapshot" ? "snapshot" : item.kind));
    assert.deepEqual(kinds.slice(0, 1), ["snapshot"]);
    assert.equal(kinds.at(-1), "resolved", `kinds: ${kinds.join(", ")}`);
    assert.ok(watch.cursor !== undefined && watch.cursor > 0n);
  });
});

describe("client across a server restart", () => {
  let server: Server;
  before(async () => {
    server = await Server.start();
  });
  after(() => server.kill());

  test("requestAndWait keeps waiting across a restart and returns the one approval", async () => {
    const client = server.client();
    const agent = agentId();
    const waiting = client.requestAndWait({ agentId: agent, toolName: "deploy", ttlSeconds: 120 });
    const pending = await firstPending(client, agent);
    await server.kill();
    await new Promise((r) => setTimeout(r, 300)); // the wait meets a dead server
    await server.start();
    const approver = server.client();
    await approver.decide(pending.id, { verdict: "approve", decider: ALICE, reason: "after" });
    const approval = await waiting;
    assert.equal(approval.id, pending.id);
    assert.equal(approval.approved, true);
    assert.equal(approval.reason, "after");
    const all = await approver.list({ agentId: agent });
    assert.equal(all.approvals.length, 1, "the restart created no second approval");
  });

  test("watch resumes after its last seq across a restart: nothing skipped, nothing twice", async () => {
    const client = server.client();
    const agent = agentId();
    const controller = new AbortController();
    // A snapshot first: once it arrives the watch is subscribed, and only then is the first
    // approval requested. (Requested before, it could be stored before the watch subscribed
    // and never reach a watch of what happens from now on: the test then waited forever.)
    const watch = client.watch({ signal: controller.signal, maxBackoffMs: 500 });
    const seqs: bigint[] = [];
    const mine: string[] = [];
    let restarted = false;
    let first: Promise<unknown> | undefined;
    for await (const item of watch) {
      if (item.type === "snapshot") {
        first ??= client.requestApproval({ agentId: agent, toolName: "one" });
        continue;
      }
      seqs.push(item.seq);
      if (item.approval?.agentId === agent && item.kind === "requested") {
        mine.push(item.approval.toolName);
        if (!restarted) {
          restarted = true;
          await first;
          await server.kill();
          await server.start();
          await server.client().requestApproval({ agentId: agent, toolName: "two" });
        } else {
          controller.abort();
        }
      }
    }
    assert.deepEqual(mine, ["one", "two"]);
    assert.deepEqual(
      seqs,
      [...seqs].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)),
      "in order",
    );
    assert.equal(new Set(seqs).size, seqs.length, "each seq once");
    assert.ok(watch.reconnects >= 1);
  });
});

test("a cursor the restored log has passed takes a new snapshot", async () => {
  // Issue 44: a watcher read up to seq N; the database is restored from a backup taken
  // before N, and agents write past N. Resumed with its seq and history id, the watch re-lists
  // every pending approval instead of skipping the restored log's events up to N.
  const server = await Server.start();
  const database = join(server.dir, "countersign.db");
  const backup = join(server.dir, "backup.db");
  try {
    const client = server.client();
    const agent = agentId();
    const request = async (toolName: string) =>
      (await client.requestApproval({ agentId: agent, toolName })).approval.id;
    const inBackup = [await request("before-0"), await request("before-1")];
    execFileSync(SERVER_BIN, ["--database", database, "backup", backup], { stdio: "ignore" });
    for (const n of [2, 3, 4]) {
      await request(`before-${n}`);
    }
    const reading = new AbortController();
    const watch = client.watch({ signal: reading.signal });
    for await (const item of watch) {
      assert.equal(item.type, "snapshot");
      assert.notEqual(item.type === "snapshot" && item.historyId, "");
      reading.abort();
    }
    const seq = watch.cursor;
    const historyId = watch.historyId;
    assert.ok(seq !== undefined && historyId !== "");

    await server.kill();
    for (const suffix of ["", "-wal", "-shm"]) {
      rmSync(`${database}${suffix}`, { force: true });
    }
    copyFileSync(backup, database);
    await server.start();
    const afterRestore = [];
    for (const n of [10, 11, 12, 13]) {
      afterRestore.push(await request(`after-${n}`));
    }
    const resuming = new AbortController();
    const resumed = client.watch({
      afterSeq: seq,
      historyId,
      includeSnapshot: false,
      signal: resuming.signal,
    });
    for await (const item of resumed) {
      assert.equal(item.type, "snapshot", `resumed after seq ${seq} of another log`);
      if (item.type === "snapshot") {
        assert.deepEqual(
          new Set(item.approvals.map((approval) => approval.id)),
          new Set([...inBackup, ...afterRestore]),
        );
        assert.ok(item.headSeq > seq);
        assert.notEqual(item.historyId, historyId);
      }
      resuming.abort();
    }
  } finally {
    await server.kill();
  }
});

test("an unreachable server is Unavailable, never an approval", async () => {
  const client = new Client({ address: `127.0.0.1:${await freePort()}` });
  await assert.rejects(
    client.requestAndWait({ agentId: "a", toolName: "bash" }, { deadlineMs: 500 }),
    Unavailable,
  );
});
