#!/usr/bin/env node
"use strict";
// Runs the countersign binary of this platform's package with our arguments, standard streams
// and environment, passes on the signals that stop it, and exits as it did.

const { spawn } = require("node:child_process");
const { binaryPath } = require("../lib/platform.js");

let binary;
try {
  binary = binaryPath();
} catch (error) {
  process.stderr.write(`countersign: ${error.message}\n`);
  process.exit(1);
}

const child = spawn(binary, process.argv.slice(2), { stdio: "inherit" });
// `countersign up` stops cleanly on these, `hook` and `mcp` withdraw their request first.
// Ctrl-C in a terminal reaches both processes; a second SIGINT changes nothing for countersign.
const forwarded = ["SIGINT", "SIGTERM", "SIGHUP"];
for (const signal of forwarded) {
  process.on(signal, () => child.kill(signal));
}
child.on("error", (error) => {
  process.stderr.write(`countersign: cannot run ${binary}: ${error.message}\n`);
  process.exit(1);
});
child.on("exit", (code, signal) => {
  if (signal) {
    // Die of the same signal, so that our caller sees what countersign's would.
    for (const name of forwarded) process.removeAllListeners(name);
    process.kill(process.pid, signal);
    return;
  }
  process.exit(code ?? 1);
});
