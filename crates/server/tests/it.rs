//! The server's black-box tests, one test binary (linked once): each module is a suite, see
//! README.md beside this file.

mod approvals;
mod audit;
mod backup;
mod ciba;
mod common;
mod edits;
mod faults;
mod groups;
mod hardening;
mod healthcheck;
mod metrics;
mod migrations;
mod observe;
mod passkeys;
mod policy;
mod process;
mod races;
mod receipts;
mod replicas;
mod security;
mod serving;
mod standards;
mod storage_full;
mod upgrade;
mod watch;
