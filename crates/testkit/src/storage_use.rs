//! Which tests depend on the storage backend, noted as they run: a test that restarts or stops
//! the test server, reads or edits its database, or asks which backend it runs on. With
//! `COUNTERSIGN_TEST_STORAGE_RECORD` naming a file, each such test appends its nextest binary
//! id and name to it; `scripts/check-postgres-list` then fails when one of them is missing from
//! the PostgreSQL pass (`.config/nextest.toml`, profile `postgres`).

use std::io::Write;

/// The file the tests' names are appended to.
pub const RECORD_VARIABLE: &str = "COUNTERSIGN_TEST_STORAGE_RECORD";

/// Notes the running test, when a record is kept and the test runs under nextest.
pub(crate) fn note() {
    let (Ok(record), Ok(binary), Ok(test)) = (
        std::env::var(RECORD_VARIABLE),
        std::env::var("NEXTEST_BINARY_ID"),
        std::env::var("NEXTEST_TEST_NAME"),
    ) else {
        return;
    };
    // One short append per line: lines of concurrent test processes do not interleave.
    let line = format!("{binary} {test}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&record)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot note this test in {RECORD_VARIABLE}={record}: {e}");
    }
}
