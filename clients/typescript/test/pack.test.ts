// The tarball `npm pack` makes installs into an empty project (as `npm init` makes it, no
// "type": "module") and works against a running server: imported, required (Node's
// require(esm)), and with its type declarations.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { agentId, PACKAGE_DIR, Server } from "./support.js";

const USE = `
import { Client, InvalidArgument } from "countersign";
import { countersignCanUseTool } from "countersign/claude-agent-sdk";

const [address, agent] = process.argv.slice(2);
const client = new Client({ address });
const waiting = client.requestAndWait({ agentId: agent, toolName: "deploy", arguments: { env: "prod" } });
let pending;
while (!pending) pending = (await client.list({ states: ["pending"], agentId: agent })).approvals[0];
await client.decide(pending.id, { verdict: "approve", decider: { channel: "cli", userId: "bob" } });
const approval = await waiting;
let invalid = false;
try { await client.requestApproval({ agentId: "", toolName: "x" }); } catch (e) { invalid = e instanceof InvalidArgument; }
console.log(JSON.stringify({ state: approval.state, invalid, adapter: typeof countersignCanUseTool }));
`;

// CommonJS, as a .js file of a default `npm init` project is; the server from the environment.
const REQUIRED = `
const { Client } = require("countersign");
const { countersignCanUseTool } = require("countersign/claude-agent-sdk");
new Client().list({ states: ["pending"] }).then((page) => {
  console.log(JSON.stringify({ listed: Array.isArray(page.approvals), adapter: typeof countersignCanUseTool }));
});
`;

const TYPED = `
import { Client, type Approval } from "countersign";
const approval: Approval = await new Client().getApproval("id");
const state: "approved" | "pending" | "rejected" | "expired" | "cancelled" | "consumed" = approval.state;
console.log(state);
`;

let server: Server;
before(async () => {
  server = await Server.start();
});
after(() => server.kill());

test("the npm pack tarball installs into an empty project and works", async () => {
  const dir = mkdtempSync(join(tmpdir(), "countersign-pack-"));
  // Built by the build step that precedes the tests: no scripts, so nothing rebuilds dist/.
  execFileSync("npm", ["pack", "--ignore-scripts", "--pack-destination", dir], {
    cwd: PACKAGE_DIR,
    stdio: "ignore",
  });
  const tarball = readdirSync(dir).find((name) => name.endsWith(".tgz"));
  assert.ok(tarball, "npm pack made a tarball");
  const project = join(dir, "project");
  execFileSync("mkdir", [project]);
  execFileSync("npm", ["init", "--yes"], { cwd: project, stdio: "ignore" });
  execFileSync(
    "npm",
    ["install", "--no-audit", "--no-fund", "--prefer-offline", join(dir, tarball)],
    { cwd: project, stdio: "ignore" },
  );
  writeFileSync(join(project, "use.mjs"), USE);
  const output = execFileSync("node", ["use.mjs", server.address, agentId()], {
    cwd: project,
    encoding: "utf8",
  });
  assert.deepEqual(JSON.parse(output), { state: "approved", invalid: true, adapter: "function" });
  writeFileSync(join(project, "index.js"), REQUIRED);
  const required = execFileSync("node", ["index.js"], {
    cwd: project,
    encoding: "utf8",
    env: { ...process.env, COUNTERSIGN_ADDRESS: server.address },
  });
  assert.deepEqual(JSON.parse(required), { listed: true, adapter: "function" });
  // The declarations type-check a consumer (tsc of this package's own dev dependencies).
  writeFileSync(join(project, "typed.mts"), TYPED);
  writeFileSync(
    join(project, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        module: "NodeNext",
        target: "ES2022",
        strict: true,
        noEmit: true,
        skipLibCheck: true,
        types: [],
      },
      files: ["typed.mts"],
    }),
  );
  execFileSync(join(PACKAGE_DIR, "node_modules", ".bin", "tsc"), ["-p", project], {
    stdio: "pipe",
  });
});
