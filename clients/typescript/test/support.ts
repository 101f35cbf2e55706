// Test support: the real countersign-server binary on a free loopback port with a temporary
// database, and an approver deciding through the server as a person would.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import { type Approval, Client, type ClientOptions, type DecideOptions } from "../src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
/** The package's directory (tests run from dist/test/). */
export const PACKAGE_DIR = resolve(here, "..", "..");
const REPO = resolve(PACKAGE_DIR, "..", "..");
const STARTUP_TIMEOUT_MS = 30_000;

/** COUNTERSIGN_SERVER_BIN, or the binary cargo builds (target/debug/countersign-server). */
export const SERVER_BIN =
  process.env.COUNTERSIGN_SERVER_BIN ??
  join(REPO, process.env.CARGO_TARGET_DIR ?? "target", "debug", "countersign-server");

export const ALICE = { channel: "cli", userId: "alice", displayName: "Alice" };

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => ok(typeof address === "object" && address ? address.port : 0));
    });
  });
}

const BASE_CONFIG = `[approvals]
sweep_interval_ms = 100
[watch]
heartbeat_interval_ms = 500
`;

/** One countersign-server process; `restart` keeps its port and database. */
export class Server {
  readonly dir = mkdtempSync(join(tmpdir(), "countersign-ts-"));
  readonly log = join(this.dir, "server.log");
  address = "";
  private process: ChildProcess | undefined;

  private constructor(
    port: number,
    private readonly env: Record<string, string>,
    config: string,
  ) {
    this.address = `127.0.0.1:${port}`;
    writeFileSync(join(this.dir, "countersign.toml"), BASE_CONFIG + config);
  }

  /** Starts a server with BASE_CONFIG plus `config` (TOML) and `env`. */
  static async start(config = "", env: Record<string, string> = {}): Promise<Server> {
    if (!existsSync(SERVER_BIN)) {
      throw new Error(
        `${SERVER_BIN} is missing: build it with \`cargo build -p countersign-server\` or set COUNTERSIGN_SERVER_BIN`,
      );
    }
    const server = new Server(await freePort(), env, config);
    await server.start();
    return server;
  }

  /** Starts the binary and returns once it serves: it logs "listening" right before. */
  async start(): Promise<void> {
    const before = existsSync(this.log) ? statSync(this.log).size : 0;
    const out = openSync(this.log, "a");
    const child = spawn(
      SERVER_BIN,
      [
        "--config",
        join(this.dir, "countersign.toml"),
        "--listen",
        this.address,
        "--database",
        join(this.dir, "countersign.db"),
      ],
      {
        stdio: ["ignore", out, out],
        env: { ...process.env, RUST_LOG: "warn,countersign_server=info", ...this.env },
      },
    );
    this.process = child;
    const deadline = Date.now() + STARTUP_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) {
        throw new Error(`countersign-server exited at start:\n${readFileSync(this.log, "utf8")}`);
      }
      if (readFileSync(this.log).subarray(before).includes("countersign-server listening")) {
        return;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`countersign-server did not serve within ${STARTUP_TIMEOUT_MS} ms`);
  }

  /** SIGKILL: the server gets no chance to say goodbye. */
  async kill(): Promise<void> {
    const child = this.process;
    this.process = undefined;
    if (child === undefined || child.exitCode !== null) {
      return;
    }
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGKILL");
    await exited;
  }

  client(options: ClientOptions = {}): Client {
    return new Client({ address: this.address, ...options });
  }
}

export const AGENT_TOKEN = "agent-token-0123456789";
export const WORKER_TOKEN = "worker-token-0123456789";
/** An agent token for coder-1 and a worker token, from the environment. */
export const TOKENS = `
[[tokens]]
name = "coder"
role = "agent"
agents = ["coder-1"]
value_env = "TEST_AGENT_TOKEN"

[[tokens]]
name = "worker"
role = "worker"
channels = ["*"]
value_env = "TEST_WORKER_TOKEN"
`;

export const TOKEN_ENV = { TEST_AGENT_TOKEN: AGENT_TOKEN, TEST_WORKER_TOKEN: WORKER_TOKEN };

let agents = 0;
/** An agent id of this test only, so tests sharing a server never see each other's approvals. */
export function agentId(): string {
  agents += 1;
  return `ts-agent-${agents}-${process.pid}`;
}

/** Waits, as an approver watching the queue would, for a pending approval of `agent`. */
export async function firstPending(
  client: Client,
  agent: string,
  timeoutMs = 20_000,
): Promise<Approval> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const page = await client.list({ states: ["pending"], agentId: agent });
    const oldest = page.approvals.at(-1);
    if (oldest !== undefined) {
      return oldest;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no pending approval of ${agent} within ${timeoutMs} ms`);
}

/** Decides the next pending approval of `agent` once it appears, as Alice. */
export async function decideNext(
  client: Client,
  agent: string,
  decision: Omit<DecideOptions, "decider">,
): Promise<Approval> {
  const pending = await firstPending(client, agent);
  return (await client.decide(pending.id, { decider: ALICE, ...decision })).approval;
}

/** A server started before the tests of the calling suite and killed after them, with a
 * client of it. */
export function sharedServer(): { readonly server: Server; readonly client: Client } {
  const shared = {} as { server: Server; client: Client };
  before(async () => {
    shared.server = await Server.start();
    shared.client = shared.server.client();
  });
  after(() => shared.server.kill());
  return shared;
}
