//! The smallest channel: it prints each approval's state. The README's "How to add a
//! channel" shows it; `cargo run -p countersign-worker --example log_channel -- URL` runs it
//! against a server (default `http://127.0.0.1:50051`) until Ctrl-C.

use std::time::Duration;

use countersign_client::{pb, Client, ClientConfig};
use countersign_worker::channel::Channel;
use countersign_worker::retry::{Backoff, Classify, Verdict};
use countersign_worker::runtime::{self, RuntimeOptions};

#[derive(Debug, thiserror::Error)]
#[error("standard output is unavailable")]
struct OutputClosed;

impl Classify for OutputClosed {
    fn verdict(&self) -> Verdict {
        Verdict::Retry { after: None }
    }
}

struct LogChannel;

impl Channel for LogChannel {
    type Error = OutputClosed;

    fn name(&self) -> &str {
        "log"
    }

    async fn show(&self, approval: &pb::Approval) -> Result<(), OutputClosed> {
        use std::io::Write;
        let state = approval.state().as_str_name();
        // The id is the server's; the agent's own text would go through `agent_text` first.
        writeln!(std::io::stdout(), "{} {state}", approval.id).map_err(|_| OutputClosed)
    }

    async fn unfinished(&self) -> Result<Vec<String>, OutputClosed> {
        // Nothing printed needs correcting later.
        Ok(Vec::new())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    let client = Client::connect(ClientConfig::new(url))?;
    let options = RuntimeOptions {
        heartbeat_timeout: Duration::from_secs(30),
        max_backoff: Duration::from_secs(10),
        retry: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
        shutdown_grace: Duration::from_secs(10),
        // Printing twice is harmless, so every start may take a snapshot.
        cursor_path: None,
        metrics_listen: None,
    };
    let shutdown = countersign_worker::shutdown::signal();
    runtime::run(client, LogChannel, options, shutdown).await?;
    Ok(())
}
