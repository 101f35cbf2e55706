//! `countersign-bench`: measures the real `countersign-server` binary against a tonic echo
//! baseline measured in the same run, and prints one table (or `--json`). It never asserts
//! times: the figures are for people to read and compare.

mod echo;
mod error;
mod figures;
mod floor;
mod history;
mod instructions;
mod load;
mod process;
mod report;
mod scrape;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::error::BenchError;
use crate::load::Load;
use crate::process::{Served, ServerSettings, ThreadTimes};
use crate::report::{Figure, Report};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Part {
    /// RequestApproval throughput: durability full and normal, and full without group commit
    Requests,
    /// request -> Decide -> WaitForDecision in closed loops
    Cycle,
    /// request -> RecordDelivery -> Decide -> Consume: bytes written per approval lifecycle
    Lifecycle,
    /// watcher delivery and waiter latency at a fixed rate
    Latency,
    /// server memory with many idle watch streams
    IdleStreams,
    /// ListApprovals of pending approvals with many historical approvals stored
    History,
    /// The storage floor: the server's request writes straight into its storage (a database
    /// the server migrated, its writer's settings, durability full, as many changes per commit
    /// as its group commit gathered), no server; RequestApproval figures are compared to it
    Floor,
}

/// Measures countersign-server against a trivial tonic echo service, in one run, on this
/// machine.
///
/// Starts the real countersign-server binary (built by cargo next to this executable) on a
/// temporary database for each configuration, or targets --server. Prints one table with each
/// figure's ratio to the echo baseline; --json for machines. Never asserts times.
#[derive(Debug, Parser)]
#[command(name = "countersign-bench", version)]
struct Args {
    /// Calls in flight at once in the closed-loop figures (issue 14's targets are at 64).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the calls are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Measured time per figure, e.g. 10s, 500ms, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Unmeasured time before each figure.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// New approvals per second in the latency figures.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Idle watch streams for the memory figure.
    #[arg(long, default_value_t = 10_000)]
    idle_streams: usize,
    /// Historical (resolved) approvals stored for the ListApprovals figure.
    #[arg(long, default_value_t = 1_000_000)]
    history: u64,
    /// Pending approvals among them.
    #[arg(long, default_value_t = 1_000)]
    pending: u64,
    /// The figures to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Part>,
    /// Measure a running server at this URL instead of starting one: only the figures that
    /// need no control over the server (requests as configured there, cycle, latency).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// A PostgreSQL URL (postgres://user@host:port/database): every started server stores
    /// there instead, each configuration on a new database created beside the one named and
    /// dropped when the run ends (the ListApprovals-with-history figure, which fills a SQLite
    /// file directly, is skipped) [default: SQLite files in a temporary directory].
    #[arg(long, value_name = "URL")]
    database: Option<String>,
    /// The countersign-server executable [default: next to this one, built by cargo].
    #[arg(long, value_name = "PATH")]
    server_binary: Option<PathBuf>,
    /// The started servers' log level (their log goes to a file in the temporary directory).
    #[arg(long, default_value = "info")]
    server_log_level: String,
    /// Count instructions instead of timing: the echo service, the server (SQLite, full,
    /// group commit) and the storage floor each run under valgrind's callgrind for this many
    /// calls (changes) after a tenth as many unmeasured; prints instructions per call by
    /// thread kind. Takes minutes (callgrind runs code about 50x slower); needs valgrind.
    #[arg(long, value_name = "CALLS")]
    instructions: Option<u64>,
    /// With --instructions: keep callgrind's files (one per thread, for callgrind_annotate)
    /// and the programs' logs in this directory instead of a temporary one.
    #[arg(long, value_name = "DIR", requires = "instructions")]
    profiles: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Serve the echo baseline on this address (used by the bench itself).
    #[arg(long, hide = true, value_name = "ADDR")]
    echo_server: Option<SocketAddr>,
    /// Write the storage floor's changes into this SQLite database, pausing for stdin (used
    /// by --instructions).
    #[arg(long, hide = true, value_name = "PATH")]
    floor_process: Option<PathBuf>,
    #[arg(long, hide = true, default_value = "")]
    floor_template: String,
    #[arg(long, hide = true, default_value = "")]
    floor_key: String,
    #[arg(long, hide = true, default_value_t = DEFAULT_FLOOR_BATCH)]
    floor_batch: usize,
    #[arg(long, hide = true, default_value_t = 0)]
    floor_warmup: u64,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 10s, 500ms or 1m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        other => return Err(format!("unknown unit {other:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(listen) = args.echo_server {
        return echo::run(listen);
    }
    if let Some(database) = &args.floor_process {
        let template = floor::Template {
            id: args.floor_template.clone(),
            key: args.floor_key.clone(),
            agent: FLOOR_AGENT.into(),
        };
        let written = instructions::floor_process(
            database,
            template,
            args.floor_batch.max(1),
            args.floor_warmup,
            args.instructions.unwrap_or(0),
            args.concurrency.max(1),
        );
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("countersign-bench floor: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("countersign-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(calls) = args.instructions {
        return match runtime.block_on(count_instructions(&args, calls)) {
            Ok(counted) if args.json => match serde_json::to_string_pretty(&counted) {
                Ok(json) => {
                    println!("{json}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("countersign-bench: {e}");
                    ExitCode::FAILURE
                }
            },
            Ok(counted) => {
                print!("{}", counted.table());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("countersign-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("countersign-bench: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", report.table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("countersign-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn wants(args: &Args, part: Part) -> bool {
    args.only.is_empty() || args.only.contains(&part)
}

fn progress(what: &str) {
    eprintln!("countersign-bench: {what}");
}

/// `--instructions`: the counts, against the server binary in a temporary directory.
async fn count_instructions(
    args: &Args,
    calls: u64,
) -> Result<instructions::Instructions, BenchError> {
    let binary = process::server_binary(args.server_binary.clone())?;
    let temporary;
    let scratch = match &args.profiles {
        // Every callgrind file in the directory is counted: it must hold no earlier run's.
        Some(dir) if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) => {
            return Err(BenchError::Setup(format!(
                "--profiles {}: not empty; name a new or empty directory",
                dir.display()
            )))
        }
        Some(dir) => dir.as_path(),
        None => {
            temporary = tempfile::Builder::new()
                .prefix("countersign-bench-")
                .tempdir()
                .map_err(|e| {
                    BenchError::Setup(format!("cannot create a temporary directory: {e}"))
                })?;
            temporary.path()
        }
    };
    let load = Load {
        concurrency: args.concurrency.max(1),
        connections: args.connections.max(1),
        warmup: args.warmup,
        duration: args.duration,
        calls: None,
    };
    instructions::count(&binary, scratch, &args.server_log_level, calls, &load).await
}

async fn run(args: &Args) -> Result<Report, BenchError> {
    let mut servers = match &args.server {
        Some(_) => None,
        None => Some(Servers::new(
            process::server_binary(args.server_binary.clone())?,
            args.server_log_level.clone(),
            args.database.clone(),
        )?),
    };
    let report = measure(args, &mut servers).await;
    // Also after a failed figure: the run's databases must not pile up on the operator's
    // PostgreSQL server.
    if let Some(servers) = servers {
        servers.drop_databases().await;
    }
    report
}

/// Every figure `args` asks for, on `servers` (None: on the running server of `--server`).
async fn measure(args: &Args, servers: &mut Option<Servers>) -> Result<Report, BenchError> {
    let open_files = process::raise_open_files_limit();
    let load = Load {
        concurrency: args.concurrency.max(1),
        connections: args.connections.max(1),
        warmup: args.warmup,
        duration: args.duration,
        calls: None,
    };
    let mut figures = Vec::new();

    progress("echo baseline");
    let echo = process::start_echo().await?;
    let times_before = echo.times_by_thread()?;
    let mut baseline = figures::echo_baseline(&echo.url(), &load).await?;
    let rate = baseline.per_second.unwrap_or_default();
    let times = times_per_call(&times_before, &echo.times_by_thread()?, rate, &load);
    baseline.note = times.note();
    times.record(&mut baseline.extra);
    echo.stop().await?;
    figures.push(baseline.clone());

    if wants(args, Part::Requests) {
        match (&args.server, servers.as_mut()) {
            (Some(url), _) => {
                progress("RequestApproval against the given server");
                let summary = figures::request_throughput(url, &load).await?;
                figures.push(Figure::throughput(
                    "RequestApproval (server as configured)",
                    &summary,
                ));
            }
            (None, Some(servers)) => {
                for (name, durability, group_commit) in [
                    ("RequestApproval, full, group commit", "full", true),
                    ("RequestApproval, normal, group commit", "normal", true),
                    ("RequestApproval, full, no group commit", "full", false),
                ] {
                    progress(name);
                    let (served, _) = servers.start(durability, group_commit).await?;
                    let times_before = served.times_by_thread()?;
                    let summary = figures::request_throughput(&served.url(), &load).await?;
                    let mut figure = Figure::throughput(name, &summary);
                    let times = times_per_call(
                        &times_before,
                        &served.times_by_thread()?,
                        summary.per_second,
                        &load,
                    );
                    let mut notes = Vec::new();
                    if let Some((batch, writer_us)) = scrape::commit_figures(&served).await {
                        notes.push(format!(
                            "{batch:.1} changes/commit, writer {writer_us:.0} us/change"
                        ));
                        figure
                            .extra
                            .insert("mean_commit_batch".into(), serde_json::json!(batch));
                        figure
                            .extra
                            .insert("writer_us_per_change".into(), serde_json::json!(writer_us));
                    }
                    notes.push(times.note());
                    figure.note = notes.join(", ");
                    times.record(&mut figure.extra);
                    served.stop().await?;
                    figures.push(figure);
                }
            }
            (None, None) => {}
        }
    }

    if let Some(servers) = servers.as_mut().filter(|_| wants(args, Part::Floor)) {
        let figure = storage_floor(servers, &load, &figures).await?;
        figures.push(figure);
    }

    let shared = match (
        &args.server,
        servers.as_mut(),
        wants(args, Part::Cycle) || wants(args, Part::Latency),
    ) {
        (Some(url), _, true) => Some((url.clone(), None)),
        (None, Some(servers), true) => {
            let (served, _) = servers.start("full", true).await?;
            Some((served.url(), Some(served)))
        }
        _ => None,
    };
    if let Some((url, served)) = shared {
        if wants(args, Part::Cycle) {
            progress("request -> Decide -> WaitForDecision cycle (full, group commit)");
            figures.push(figures::full_cycle(&url, &load).await?);
        }
        if wants(args, Part::Latency) {
            progress(&format!(
                "watcher and waiter latency at {} approvals/s (full, group commit)",
                args.rate
            ));
            let (watcher, waiter) = figures::delivery_latency(&url, &url, &load, args.rate).await?;
            figures.push(watcher);
            figures.push(waiter);
            // On PostgreSQL: decisions made on a second replica of the same database.
            if let Some(servers) = servers.as_mut().filter(|s| s.postgres.is_some()) {
                progress(&format!(
                    "waiter latency at {} approvals/s, Decide on a second replica",
                    args.rate
                ));
                let replica = servers.start_replica().await?;
                let (_, across) =
                    figures::delivery_latency(&url, &replica.url(), &load, args.rate).await?;
                figures.push(across);
                replica.stop().await?;
            }
        }
        if let Some(served) = served {
            served.stop().await?;
        }
    }

    if let Some(servers) = servers.as_mut().filter(|_| wants(args, Part::Lifecycle)) {
        progress("approval lifecycle: request -> RecordDelivery -> Decide -> Consume (full)");
        let (served, _) = servers.start("full", true).await?;
        let written_before = served.bytes_written()?;
        // No unmeasured warm-up: every lifecycle's writes are counted.
        let unwarmed = Load {
            warmup: Duration::ZERO,
            ..load.clone()
        };
        let (summary, approval_bytes) = figures::lifecycle(&served.url(), &unwarmed).await?;
        let written = served.bytes_written()?.saturating_sub(written_before);
        served.stop().await?;
        // One more lifecycle measured the approval's size.
        let per_lifecycle = written as f64 / (summary.ops + 1) as f64;
        let mut figure =
            Figure::throughput("lifecycle: request, deliver, approve, consume", &summary);
        figure.note = format!(
            "{:.1} KiB written per lifecycle (database + WAL), {:.1}x the approval's {approval_bytes} encoded bytes",
            per_lifecycle / 1024.0,
            per_lifecycle / approval_bytes.max(1) as f64
        );
        figure.extra.insert(
            "bytes_written_per_lifecycle".into(),
            serde_json::json!(per_lifecycle),
        );
        figure.extra.insert(
            "approval_encoded_bytes".into(),
            serde_json::json!(approval_bytes),
        );
        figures.push(figure);
    }

    if let Some(servers) = servers.as_mut().filter(|_| wants(args, Part::IdleStreams)) {
        progress(&format!(
            "{} idle watch streams (open files limit {open_files})",
            args.idle_streams
        ));
        let (served, _) = servers.start("full", true).await?;
        let figure = figures::idle_streams(&served, args.idle_streams).await?;
        served.stop().await?;
        figures.push(figure);
    }

    if let Some(servers) = servers
        .as_mut()
        .filter(|servers| wants(args, Part::History) && servers.postgres.is_none())
    {
        progress(&format!(
            "ListApprovals with {} historical approvals: inserting them",
            args.history
        ));
        let (served, dir) = servers.start("full", true).await?;
        let (template_id, template_key) = figures::history_template(&served.url()).await?;
        served.stop().await?;
        history::insert_copies(
            &dir.join("countersign.db"),
            &template_id,
            &template_key,
            args.history,
        )
        .await?;
        let served = servers.start_in(&dir, "full", true).await?;
        figures::create_pending(&served.url(), args.pending).await?;
        progress("ListApprovals of pending approvals");
        let page_size = 50;
        let summary = figures::list_pending(&served.url(), &load, page_size).await?;
        served.stop().await?;
        let mut figure = Figure::throughput(
            format!(
                "ListApprovals pending, page {page_size}, {} stored",
                args.history + args.pending + 1
            ),
            &summary,
        );
        figure.note = format!("{} pending", args.pending);
        figures.push(figure);
    }

    let floor = figures
        .iter()
        .find(|f| f.name.starts_with(FLOOR))
        .and_then(|f| f.per_second);
    for figure in figures.iter_mut().skip(1) {
        if figure.name.contains('@') {
            figure.against_latency(&baseline);
        } else {
            figure.against_throughput(&baseline);
        }
        if let Some(floor) = floor.filter(|_| figure.name.starts_with("RequestApproval")) {
            figure.against_floor(floor);
        }
    }
    Ok(Report {
        machine: machine_label(),
        concurrency: load.concurrency,
        connections: load.connections,
        duration_secs: load.duration.as_secs_f64(),
        message_bytes: figures::message_bytes(),
        figures,
    })
}

/// The storage floor figure's name starts so.
const FLOOR: &str = "storage floor";

/// The agent of the template approval the floor copies (`figures::template_request`'s
/// `bench-{purpose}`).
const FLOOR_AGENT: &str = "bench-floor";

/// Changes per commit of the floor when no group-commit figure measured the server's.
const DEFAULT_FLOOR_BATCH: usize = 32;

/// The storage floor on a database a server created, migrated and wrote one approval into,
/// in transactions of the mean commit batch of "RequestApproval, full, group commit" when
/// that ran before.
async fn storage_floor(
    servers: &mut Servers,
    load: &Load,
    figures: &[Figure],
) -> Result<Figure, BenchError> {
    let batch = figures
        .iter()
        .find(|f| f.name == "RequestApproval, full, group commit")
        .and_then(|f| f.extra.get("mean_commit_batch"))
        .and_then(|batch| batch.as_f64())
        .map_or(DEFAULT_FLOOR_BATCH, |batch| batch.round().max(1.0) as usize);
    let (served, _) = servers.start("full", true).await?;
    let (_, id, key) = figures::template_request(&served.url(), "floor").await?;
    served.stop().await?;
    let template = floor::Template {
        id,
        key,
        agent: FLOOR_AGENT.into(),
    };
    let storage = match servers.postgres {
        Some(_) => floor::Storage::Postgres(&servers.last_database),
        None => floor::Storage::Sqlite(std::path::Path::new(&servers.last_database)),
    };
    let backend = if servers.postgres.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    progress(&format!(
        "{FLOOR}: request writes straight into {backend}, {batch} per commit"
    ));
    let measured = floor::request_writes(storage, &template, batch, load).await?;
    let mut figure = Figure::other(
        format!("{FLOOR}: request writes, {backend}, full"),
        format!("{batch} changes/commit, no server"),
    );
    figure.operations = Some(measured.changes);
    figure.per_second = Some(measured.per_second);
    figure
        .extra
        .insert("changes_per_commit".into(), serde_json::json!(batch));
    Ok(figure)
}

/// Server time per call, by thread kind: the CPU it used, and the time its threads waited,
/// runnable, for a CPU (what the machine's other work cost a serial section such as the
/// writer's).
struct TimesPerCall {
    cpu: Vec<(String, f64)>,
    waited: Vec<(String, f64)>,
}

impl TimesPerCall {
    fn note(&self) -> String {
        let mut note = format!(
            "server CPU ~{:.0} us/call ({})",
            total(&self.cpu),
            parts(&self.cpu)
        );
        if total(&self.waited) >= 1.0 {
            note.push_str(&format!(
                ", waited for a CPU ~{:.0} us/call ({})",
                total(&self.waited),
                parts(&self.waited)
            ));
        }
        note
    }

    /// Both figures, by thread kind, among a figure's extra figures.
    fn record(&self, extra: &mut serde_json::Map<String, serde_json::Value>) {
        extra.insert("server_cpu_us_per_call".into(), by_kind_json(&self.cpu));
        extra.insert(
            "server_waited_for_cpu_us_per_call".into(),
            by_kind_json(&self.waited),
        );
    }
}

fn total(by_kind: &[(String, f64)]) -> f64 {
    by_kind.iter().map(|(_, us)| us).sum()
}

fn parts(by_kind: &[(String, f64)]) -> String {
    by_kind
        .iter()
        .filter(|(_, us)| *us >= 1.0)
        .map(|(name, us)| format!("{name} {us:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn by_kind_json(by_kind: &[(String, f64)]) -> serde_json::Value {
    serde_json::json!({
        "total": total(by_kind),
        "by_thread": by_kind.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

/// Time used between two readings over the calls made meanwhile. The readings span the
/// warm-up too, so the calls are estimated from the measured rate over the whole span.
fn times_per_call(
    before: &[(String, ThreadTimes)],
    after: &[(String, ThreadTimes)],
    per_second: f64,
    load: &Load,
) -> TimesPerCall {
    let calls = (per_second * (load.warmup + load.duration).as_secs_f64()).max(1.0);
    let mut per_call = TimesPerCall {
        cpu: Vec::new(),
        waited: Vec::new(),
    };
    for (name, used) in after {
        let earlier = before
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, times)| *times)
            .unwrap_or_default();
        let us =
            |now: Duration, then: Duration| now.saturating_sub(then).as_secs_f64() * 1e6 / calls;
        // Thread names are cut at 15 characters: "sqlx-sqlite-wor", "tokio-rt-worker",
        // "store-writer".
        let kind = match name.as_str() {
            n if n.starts_with("sqlx-sqlite") => "sqlite",
            n if n.starts_with("tokio") => "tokio",
            n if n.starts_with("store-writer") => "writer",
            _ => "other",
        };
        add(&mut per_call.cpu, kind, us(used.cpu, earlier.cpu));
        add(&mut per_call.waited, kind, us(used.waited, earlier.waited));
    }
    per_call
}

fn add(by_kind: &mut Vec<(String, f64)>, kind: &str, us: f64) {
    match by_kind.iter_mut().find(|(k, _)| k == kind) {
        Some((_, total)) => *total += us,
        None => by_kind.push((kind.to_string(), us)),
    }
}

/// Starts servers, each configuration on a database of its own: a SQLite file in a temporary
/// directory, or a new database on the PostgreSQL server of `postgres`.
struct Servers {
    binary: PathBuf,
    log_level: String,
    scratch: tempfile::TempDir,
    started: usize,
    postgres: Option<String>,
    /// The database the last server started on.
    last_database: String,
    /// The numbers of the PostgreSQL databases this run created.
    created: Vec<usize>,
}

impl Servers {
    fn new(
        binary: PathBuf,
        log_level: String,
        postgres: Option<String>,
    ) -> Result<Servers, BenchError> {
        let scratch = tempfile::Builder::new()
            .prefix("countersign-bench-")
            .tempdir()
            .map_err(|e| BenchError::Setup(format!("cannot create a temporary directory: {e}")))?;
        Ok(Servers {
            binary,
            log_level,
            scratch,
            started: 0,
            postgres,
            last_database: String::new(),
            created: Vec::new(),
        })
    }

    /// A server on a new database; returns it and its directory.
    async fn start(
        &mut self,
        durability: &'static str,
        group_commit: bool,
    ) -> Result<(Served, PathBuf), BenchError> {
        self.started += 1;
        let dir = self.scratch.path().join(format!("server-{}", self.started));
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::Setup(format!("cannot create {}: {e}", dir.display())))?;
        let database = match &self.postgres {
            Some(url) => {
                let database = process::create_postgres_database(url, self.started).await?;
                self.created.push(self.started);
                database
            }
            None => dir.join("countersign.db").display().to_string(),
        };
        let settings = ServerSettings {
            durability,
            group_commit,
            log_level: self.log_level.clone(),
        };
        let served = process::start_server(&self.binary, &dir, &database, &settings).await?;
        self.last_database = database;
        Ok((served, dir))
    }

    /// Drops the PostgreSQL databases this run created, ending the connections of servers
    /// still running; says on stderr what it could not drop (the figures stand).
    async fn drop_databases(self) {
        if let Some(url) = &self.postgres {
            if let Err(e) = process::drop_postgres_databases(url, &self.created).await {
                eprintln!("countersign-bench: {e}");
            }
        }
    }

    /// Another server (full, group commit) on the database the last one started on.
    async fn start_replica(&mut self) -> Result<Served, BenchError> {
        self.started += 1;
        let dir = self.scratch.path().join(format!("server-{}", self.started));
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::Setup(format!("cannot create {}: {e}", dir.display())))?;
        let settings = ServerSettings {
            durability: "full",
            group_commit: true,
            log_level: self.log_level.clone(),
        };
        process::start_server(&self.binary, &dir, &self.last_database, &settings).await
    }

    /// A server on the SQLite database in `dir`.
    async fn start_in(
        &self,
        dir: &std::path::Path,
        durability: &'static str,
        group_commit: bool,
    ) -> Result<Served, BenchError> {
        let settings = ServerSettings {
            durability,
            group_commit,
            log_level: self.log_level.clone(),
        };
        let database = dir.join("countersign.db").display().to_string();
        process::start_server(&self.binary, dir, &database, &settings).await
    }
}

/// Cores and CPU model, from the OS.
fn machine_label() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!("{cores} cores ({model})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
