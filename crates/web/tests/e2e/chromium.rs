//! Headless Chromium driven through chromedriver (Debian's `chromium` and `chromium-driver`):
//! one fresh profile and one chromedriver per test, both gone when the test ends: chromedriver
//! leads a process group of its own, which Chromium's processes join, and the whole group is
//! killed when the test lets go of the browser, also when it fails before `stop`; Chromium's
//! crash handlers, which would leave the group (and outlive every test), are not started.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use std::str::FromStr;

use axum::http::Method;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::Url;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::common::free_port;

pub struct Chromium {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    screenshots: PathBuf,
}

impl Chromium {
    pub async fn start() -> Chromium {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver (Debian package chromium-driver) must be installed; .ci/run installs it");
        let profile = tempfile::tempdir().expect("profile directory");
        let args = [
            "--headless",
            "--no-sandbox",
            // No crashpad handlers: they start sessions of their own and never exit.
            "--disable-breakpad",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1280,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), json!({ "args": args }));
        let url = format!("http://127.0.0.1:{port}");
        let mut last_error = None;
        for _ in 0..100 {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    let screenshots =
                        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web-screenshots");
                    std::fs::create_dir_all(&screenshots).expect("screenshot directory");
                    return Chromium {
                        client,
                        driver,
                        _profile: profile,
                        screenshots,
                    };
                }
                Err(error) => last_error = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("cannot start a Chromium session through chromedriver: {last_error:?}");
    }

    /// Runs `source` in every page this browser loads from now on, before the page's own
    /// scripts and whatever its CSP says (DevTools' `Page.addScriptToEvaluateOnNewDocument`
    /// through chromedriver): a probe that sees a page from its first node.
    pub async fn run_on_every_page(&self, source: &str) {
        self.client
            .issue_cmd(WebDriverPost {
                path: "goog/cdp/execute",
                body: json!({
                    "cmd": "Page.addScriptToEvaluateOnNewDocument",
                    "params": { "source": source },
                }),
            })
            .await
            .expect("DevTools command through chromedriver");
    }

    /// Gives the browser a virtual authenticator (W3C WebAuthn §11, "WebDriver Extension
    /// Capability"): a platform authenticator with resident keys that verifies its user, so
    /// that `navigator.credentials` answers without a person.
    pub async fn add_virtual_authenticator(&self) {
        self.client
            .issue_cmd(WebDriverPost {
                path: "webauthn/authenticator",
                body: json!({
                    "protocol": "ctap2",
                    "transport": "internal",
                    "hasResidentKey": true,
                    "hasUserVerification": true,
                    "isUserVerified": true,
                    "isUserConsenting": true,
                }),
            })
            .await
            .expect("a virtual authenticator through chromedriver");
    }

    /// Saves a PNG of the page under target/tmp/web-screenshots/.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let path = self.screenshots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    pub async fn stop(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Chromium {
    /// Kills chromedriver's process group: chromedriver and every Chromium process.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            // SAFETY: kill with the (negated) id of a process group our child leads; a group
            // that is already gone makes it fail with ESRCH, which is fine.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            }
        }
    }
}

/// A POST to a WebDriver endpoint of the session (`session/{id}/<path>`).
#[derive(Debug)]
struct WebDriverPost {
    path: &'static str,
    body: serde_json::Value,
}

impl WebDriverCompatibleCommand for WebDriverPost {
    fn endpoint(
        &self,
        base_url: &Url,
        session_id: Option<&str>,
    ) -> Result<Url, <Url as FromStr>::Err> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _request_url: &Url) -> (Method, Option<String>) {
        (Method::POST, Some(self.body.to_string()))
    }
}
