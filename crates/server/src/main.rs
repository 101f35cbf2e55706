//! `countersign-server`: the approval server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use countersign_core::receipt::KeySet;
use countersign_proto::v1::approval_service_server::SERVICE_NAME as APPROVAL_SERVICE;
use countersign_server::config::{Config, LogFormat};
use countersign_server::receipts::{ReceiptKeys, KEYS_FILE};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// countersign: human approval of AI-agent tool calls, over gRPC, stored in SQLite.
///
/// Settings come from the TOML file given with --config (every option is in
/// docs/configuration.md; tokens, TLS, approvers and policy rules in docs/security.md), then
/// from these flags and environment variables, which win over the file. Token values come
/// from the environment variables the file names, never from the file itself.
#[derive(Debug, Parser)]
#[command(name = "countersign-server", version)]
struct Args {
    /// TOML configuration file.
    #[arg(long, env = "COUNTERSIGN_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:50051].
    #[arg(long, env = "COUNTERSIGN_LISTEN")]
    listen: Option<SocketAddr>,
    /// SQLite database file, created when missing [default: ./countersign.db], or a
    /// PostgreSQL URL (postgres://user:password@host/database) that several replicas share.
    #[arg(long, env = "COUNTERSIGN_DATABASE", global = true)]
    database: Option<PathBuf>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "COUNTERSIGN_LOG_FORMAT", value_parser = ["text", "json"])]
    log_format: Option<String>,
    /// Address of the Prometheus /metrics endpoint [default: none, no endpoint].
    #[arg(long, env = "COUNTERSIGN_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ask a running server's gRPC health service whether the approval service is serving;
    /// exit 0 when it is, 1 otherwise. For container health checks.
    Healthcheck {
        /// The server's gRPC URL.
        #[arg(long, default_value = "http://127.0.0.1:50051")]
        url: String,
        /// Give up after this many milliseconds.
        #[arg(long, default_value_t = 3000)]
        timeout_ms: u64,
        /// PEM file of the CA that signed the server's certificate, for an https:// URL.
        #[arg(long, env = "COUNTERSIGN_CA_CERT")]
        ca_cert: Option<PathBuf>,
    },
    /// Write a consistent copy of the SQLite database to FILE while the server keeps serving,
    /// then verify the copy's audit chain and print its newest seq as JSON.
    ///
    /// Run it on the server's machine with the server's --config or --database (before or
    /// after `backup FILE`); it reads the
    /// database with a connection of its own. FILE must not exist (it is never overwritten),
    /// and a database whose audit chain does not verify is reported and not copied. From
    /// another machine: `countersign backup NAME` (admin token) has the server write the copy
    /// into its `storage.backup_dir`. Restoring: docs/deployment.md#backup-and-restore-sqlite. On
    /// PostgreSQL, back up with pg_dump.
    Backup {
        /// The new backup file.
        file: PathBuf,
    },
    /// Check a SQLite database file in full (a backup before restoring it), changing nothing:
    /// SQLite's integrity check, the whole audit hash chain event by event, its ends against
    /// the anchor, and every approval against its events. Prints a summary as JSON and exits
    /// 0, or names the first bad seq or approval and exits 1.
    ///
    /// The start-up checks read only the chain's ends: run this on a copy before restoring it
    /// (docs/deployment.md#backup-and-restore-sqlite). A PostgreSQL database is checked where
    /// it runs, with VerifyAudit.
    Verify {
        /// The database file.
        file: PathBuf,
        /// A signed checkpoint (`audit checkpoint`) the file's chain must pass through: its
        /// signature is checked against the receipt keys, and the file's event at its seq must
        /// have its hash.
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// The public keys as a JWKS file [default: the receipt keys in `[receipts] keys_dir`].
        #[arg(long, value_name = "FILE", requires = "checkpoint")]
        keys: Option<PathBuf>,
    },
    /// The audit chain's anchor in the database (run with the server stopped or running).
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The keys decision receipts are signed with (`receipt-keys.json` in `[receipts]
    /// keys_dir`; docs/security.md#decision-receipts).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Print the public keys as a JWKS document, and their fingerprint on stderr (the key set
    /// is made when there is none).
    Show,
    /// Make a new signing key, endorsed by the current one, and drop the current private key.
    /// The old public keys stay in the set, so receipts signed before still verify, and the
    /// fingerprint clients pinned stays. Restart the server (every replica) to sign with it.
    Rotate,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Print the chain's head and tail (seq and hash) as JSON, to keep outside the database:
    /// a later head must continue from it, so removed or rewritten rows show.
    Head,
    /// Print the chain's head (seq and hash) signed with the receipt key: a compact JWS that a
    /// backup is verified against offline (`verify FILE --checkpoint`). Run it on a schedule
    /// and keep the output outside the server.
    Checkpoint,
    /// Chain the event rows that have no hash and anchor the chain to the rows as they are
    /// now. The server refuses to start on such a database until this is run: run it only
    /// after checking the rows (it is logged). The log begins a new history id: watchers
    /// re-list.
    Rechain,
    /// Give the event log a new history id, with the server stopped, after restoring it by
    /// other means than a countersign backup file (pg_restore, litestream restore): watch
    /// cursors read before are then answered like cursors ahead of the log, and workers
    /// re-list instead of resuming past events they never saw.
    NewHistory,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Healthcheck {
        url,
        timeout_ms,
        ca_cert,
    }) = &args.command
    {
        return healthcheck(url, Duration::from_millis(*timeout_ms), ca_cert.as_deref());
    }
    let mut config = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(config) => config,
            Err(e) => {
                eprintln!("countersign-server: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(database) = args.database {
        config.database = database;
    }
    if let Some(metrics_listen) = args.metrics_listen {
        config.metrics.listen = Some(metrics_listen);
    }
    match args.log_format.as_deref() {
        Some("json") => config.log.format = LogFormat::Json,
        Some(_) => config.log.format = LogFormat::Text,
        None => {}
    }
    countersign_server::logging::init(&config);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("countersign-server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Keys { command }) = &args.command {
        return keys(command, &config);
    }
    if let Some(Command::Audit { command }) = &args.command {
        return runtime.block_on(audit(command, &config));
    }
    if let Some(Command::Backup { file }) = &args.command {
        return runtime.block_on(backup(&config, file));
    }
    if let Some(Command::Verify {
        file,
        checkpoint,
        keys,
    }) = &args.command
    {
        let against = checkpoint.as_deref().map(|checkpoint| Against {
            checkpoint,
            keys: keys
                .clone()
                .unwrap_or_else(|| config.receipt_keys_dir().join(KEYS_FILE)),
        });
        return runtime.block_on(verify(file, against));
    }
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "countersign-server stopped");
            eprintln!("countersign-server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Checks the health of the approval service at `url`, printing the answer.
fn healthcheck(url: &str, timeout: Duration, ca_cert: Option<&std::path::Path>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("countersign-server healthcheck: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let checked = runtime.block_on(async {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?
            .connect_timeout(timeout)
            .timeout(timeout);
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read CA certificate {}: {e}", path.display()))?;
            endpoint = endpoint.tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
            )?;
        }
        let channel = endpoint.connect().await?;
        let mut client = HealthClient::new(channel);
        let answer = client
            .check(HealthCheckRequest {
                service: APPROVAL_SERVICE.to_string(),
            })
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(answer.into_inner().status)
    });
    match checked {
        Ok(status) if status == ServingStatus::Serving as i32 => {
            println!("{APPROVAL_SERVICE} at {url}: SERVING");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            let name = ServingStatus::try_from(status)
                .map(|s| s.as_str_name())
                .unwrap_or("UNKNOWN");
            println!("{APPROVAL_SERVICE} at {url}: {name}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("countersign-server healthcheck: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `audit head`, `audit rechain` and `audit new-history`.
fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn keys(command: &KeysCommand, config: &Config) -> ExitCode {
    let dir = config.receipt_keys_dir();
    let done = match command {
        KeysCommand::Show => {
            ReceiptKeys::load_or_create(&dir, config.receipts.ttl_seconds).map(|keys| {
                println!("{}", keys.jwks());
                eprintln!("fingerprint: {}", keys.fingerprint());
            })
        }
        KeysCommand::Rotate => ReceiptKeys::rotate(&dir, now_millis()).map(|(old, new)| {
            println!(
                "{}",
                serde_json::json!({ "retired_kid": old, "current_kid": new })
            );
        }),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("countersign-server keys: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn audit(command: &AuditCommand, config: &Config) -> ExitCode {
    use countersign_server::integrity;
    let anchor_json = |anchor: &integrity::Anchor| {
        serde_json::json!({
            "head_seq": anchor.head_seq,
            "head_hash": anchor.head_hash,
            "tail_seq": anchor.tail_seq,
            "tail_prev_hash": anchor.tail_prev_hash,
        })
    };
    let done = match command {
        AuditCommand::Head => integrity::head(&config.database)
            .await
            .map(|anchor| println!("{}", anchor_json(&anchor))),
        AuditCommand::Checkpoint => {
            let keys = match ReceiptKeys::load_or_create(
                &config.receipt_keys_dir(),
                config.receipts.ttl_seconds,
            ) {
                Ok(keys) => keys,
                Err(e) => {
                    eprintln!("countersign-server audit: {e}");
                    return ExitCode::FAILURE;
                }
            };
            integrity::checkpoint(&config.database, &keys, now_millis())
                .await
                .map(|checkpoint| println!("{checkpoint}"))
        }
        AuditCommand::Rechain => integrity::rechain(&config.database).await.map(|rechained| {
            println!(
                "{}",
                serde_json::json!({
                    "rows_chained": rechained.rows_chained,
                    "before": anchor_json(&rechained.before),
                    "after": anchor_json(&rechained.after),
                    "history_id": rechained.history_id,
                })
            )
        }),
        AuditCommand::NewHistory => integrity::new_history(&config.database)
            .await
            .map(|history_id| println!("{}", serde_json::json!({ "history_id": history_id }))),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "countersign-server audit: {}: {e}",
                countersign_server::config::Database::of(&config.database)
            );
            ExitCode::FAILURE
        }
    }
}

/// `backup FILE`.
async fn backup(config: &Config, file: &std::path::Path) -> ExitCode {
    match countersign_server::store::backup::backup_database(&config.database, file).await {
        Ok(made) => {
            println!(
                "{}",
                serde_json::json!({
                    "path": made.path.display().to_string(),
                    "bytes": made.bytes,
                    "events_checked": made.report.events_checked,
                    "first_seq": made.report.first_seq,
                    "newest_seq": made.report.last_seq,
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "countersign-server backup: {}: {e}",
                countersign_server::config::Database::of(&config.database)
            );
            ExitCode::FAILURE
        }
    }
}

/// `verify FILE`.
/// A signed checkpoint a database file is verified against, and the keys it is checked with.
struct Against<'a> {
    checkpoint: &'a std::path::Path,
    keys: PathBuf,
}

/// [`countersign_server::store::backup::check_checkpoint`] with the files read.
async fn check_checkpoint(file: &std::path::Path, against: &Against<'_>) -> Result<i64, String> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let keys = KeySet::from_jwks(&read(&against.keys)?).map_err(|e| e.to_string())?;
    countersign_server::store::backup::check_checkpoint(
        file,
        read(against.checkpoint)?.trim(),
        &keys,
    )
    .await
    .map_err(|e| e.to_string())
}

async fn verify(file: &std::path::Path, against: Option<Against<'_>>) -> ExitCode {
    let wal = countersign_server::store::backup::wal_of(file);
    if wal.exists() {
        eprintln!(
            "countersign-server verify: {} is beside the file and is read as part of it (its commits belong to the database). If it was not written with this file, move it away: SQLite would replay it onto the file",
            wal.display()
        );
    }
    match countersign_server::store::backup::verify_file(file).await {
        Ok(report) => {
            let mut summary = serde_json::json!({
                "path": file.display().to_string(),
                "integrity": "ok",
                "events_checked": report.events_checked,
                "first_seq": report.first_seq,
                "newest_seq": report.last_seq,
            });
            if let Some(against) = &against {
                match check_checkpoint(file, against).await {
                    Ok(seq) => summary["checkpoint_seq"] = seq.into(),
                    Err(problem) => {
                        eprintln!("countersign-server verify: {problem}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "countersign-server verify: {}: {e}",
                countersign_server::config::Database::of(file)
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    // Refusals that need no socket come before the bind: a refused server never listens.
    config.validate()?;
    config.check_backup_dir()?;
    #[cfg(unix)]
    match countersign_server::serving::raise_open_file_limit() {
        Ok((before, after)) => {
            tracing::info!(
                before,
                after,
                "open-file limit (soft) raised to the hard limit"
            )
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    // The handlers are in place before the bind: a SIGTERM that comes once the port answers
    // (while the store opens) is a clean stop, not the default action's death by signal.
    let stop = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    countersign_server::serve(config, listener, stop).await?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM. The handlers are registered when this is called, not when
/// the future is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                }
                (Ok(mut only), Err(e)) | (Err(e), Ok(mut only)) => {
                    tracing::warn!(error = %e, "cannot listen for one of SIGINT and SIGTERM; the other stops the server");
                    only.recv().await;
                }
                (Err(e), Err(_)) => {
                    tracing::warn!(error = %e, "cannot listen for SIGINT or SIGTERM; the server stops only when killed");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
