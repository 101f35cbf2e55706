"use strict";
// Which platform package carries the countersign binary for this machine, and where it is.
// The table is platforms.json, which scripts/npm-packages also builds the packages from.

const path = require("node:path");
const PLATFORMS = require("../platforms.json");

/** "glibc" or "musl" on Linux (node reports the glibc it runs on, none on musl); else undefined. */
function linuxLibc(report = process.report) {
  if (process.platform !== "linux") return undefined;
  const header = report && typeof report.getReport === "function" ? report.getReport().header : {};
  return header.glibcVersionRuntime ? "glibc" : "musl";
}

/** The platforms.json entry for `os`/`cpu`/`libc`, or undefined when none is built. */
function platformEntry(os, cpu, libc) {
  return PLATFORMS.find(
    (entry) => entry.os === os && entry.cpu === cpu && (entry.libc === undefined || entry.libc === libc),
  );
}

function describe(os, cpu, libc) {
  return libc ? `${os}-${cpu} (${libc})` : `${os}-${cpu}`;
}

/** The absolute path of the binary for this machine; throws an Error saying what is wrong. */
function binaryPath(os = process.platform, cpu = process.arch, libc = linuxLibc()) {
  const entry = platformEntry(os, cpu, libc);
  if (!entry) {
    const supported = PLATFORMS.map((p) => describe(p.os, p.cpu, p.libc)).join(", ");
    throw new Error(
      `no prebuilt countersign for this platform, ${describe(os, cpu, libc)}; ` +
        `the npm package has binaries for ${supported}. ` +
        "Elsewhere build it from a source checkout with Rust 1.88 or later: cargo install --locked --path crates/cli",
    );
  }
  let manifest;
  try {
    manifest = require.resolve(`${entry.package}/package.json`);
  } catch {
    throw new Error(
      `the package ${entry.package}, which carries countersign for ${describe(os, cpu, libc)}, is not installed: ` +
        "npm installs it with countersign-cli unless optional dependencies are left out " +
        "(--omit=optional, --no-optional); install countersign-cli again without that",
    );
  }
  return path.join(path.dirname(manifest), "bin", "countersign");
}

module.exports = { binaryPath, platformEntry, linuxLibc };
