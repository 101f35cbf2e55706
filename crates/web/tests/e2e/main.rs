//! End-to-end tests of the web inbox: the real countersign server on loopback, the real
//! `countersign-web` binary, the SDK on the agent side, and headless Chromium through
//! chromedriver for the browser tests.

mod approver;
mod browser;
mod chromium;
mod common;
mod http;
mod passkeys;
mod screens;
