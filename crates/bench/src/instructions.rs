//! `--instructions N`: the request path's cost in instructions, which valgrind's callgrind
//! counts the same for the same binary and input whatever else the machine runs (wall-clock
//! figures on a shared machine move by tens of percent between runs).
//!
//! Three programs run under callgrind, one after the other, each as the timed figures run
//! them: the echo service (N echo calls), the real server on SQLite (full durability, group
//! commit; N RequestApproval calls) and the storage floor's writes (N changes, in commits of
//! the server's mean batch). Each first does a tenth of N unmeasured (connections, prepared
//! statements, caches), then the bench zeroes callgrind's counters (`callgrind_control -z`),
//! runs the N, and dumps them (`callgrind_control -d`, one file per thread with
//! `--separate-threads=yes`). A thread's kind is read from the functions in its file: the
//! writer's loop, sqlx's SQLite worker, tokio's multi-thread workers; the rest is "other".

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::error::BenchError;
use crate::figures;
use crate::floor;
use crate::load::Load;
use crate::process::{self, Served, ServerSettings};
use crate::scrape;

/// Instructions of one program per call (or change), by thread kind.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Counted {
    pub name: String,
    pub per_call: f64,
    pub by_thread: Vec<(String, f64)>,
    pub note: String,
}

impl Counted {
    fn kind(&self, kind: &str) -> f64 {
        self.by_thread
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The three counts and the two targets.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Instructions {
    pub calls: u64,
    pub warmup_calls: u64,
    pub concurrency: usize,
    pub connections: usize,
    pub echo: Counted,
    pub server: Counted,
    pub floor: Counted,
    /// The writer's instructions per change over the floor's (target: at most 2).
    pub writer_vs_floor: f64,
    /// The server's instructions per request over 4x the echo's per call plus the floor's per
    /// change (target: at most 1).
    pub server_vs_budget: f64,
}

impl Instructions {
    pub fn table(&self) -> String {
        let mut out = format!(
            "instructions per call (valgrind callgrind), {} calls after {} unmeasured, {} in flight over {} connections\n\n",
            self.calls, self.warmup_calls, self.concurrency, self.connections
        );
        out.push_str("| program | instructions per call | by thread kind | note |\n| --- | --- | --- | --- |\n");
        for counted in [&self.echo, &self.server, &self.floor] {
            let parts: Vec<String> = counted
                .by_thread
                .iter()
                .map(|(kind, n)| format!("{kind} {}", thousands(*n)))
                .collect();
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                counted.name,
                thousands(counted.per_call),
                parts.join(", "),
                counted.note
            ));
        }
        out.push_str(&format!(
            "\nwriter per change / floor per change: {:.2}x (target <= 2x)\n\
             server per request / (4 x echo per call + floor per change): {:.2}x (target <= 1x)\n",
            self.writer_vs_floor, self.server_vs_budget
        ));
        out
    }
}

/// `12,345,678`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Runs the three programs under callgrind for `calls` calls each (after a tenth as many
/// unmeasured), the server from `binary`, everything in `scratch`.
pub async fn count(
    binary: &Path,
    scratch: &Path,
    log_level: &str,
    calls: u64,
    load: &Load,
) -> Result<Instructions, BenchError> {
    check_tools().await?;
    let calls = calls.max(1);
    let warmup_calls = (calls / 10).max(1);
    let fixed = |calls| Load {
        calls: Some(calls),
        ..load.clone()
    };

    eprintln!("countersign-bench: instructions of the echo service");
    let dir = directory(scratch, "echo")?;
    let echo = process::start_echo_under(&callgrind(&dir)).await?;
    figures::echo_baseline(&echo.url(), &fixed(warmup_calls)).await?;
    control(&echo, "-z").await?;
    figures::echo_baseline(&echo.url(), &fixed(calls)).await?;
    control(&echo, "-d").await?;
    drop(echo);
    let echo = counted(
        "echo (tonic unary)",
        &dir,
        calls,
        String::new(),
        server_thread_kind,
    )?;

    eprintln!("countersign-bench: instructions of RequestApproval (SQLite, full, group commit)");
    let dir = directory(scratch, "server")?;
    let settings = ServerSettings {
        durability: "full",
        group_commit: true,
        log_level: log_level.to_string(),
    };
    let database = dir.join("countersign.db").display().to_string();
    let server =
        process::start_server_under(&callgrind(&dir), binary, &dir, &database, &settings).await?;
    requests(&server, &fixed(warmup_calls)).await?;
    control(&server, "-z").await?;
    requests(&server, &fixed(calls)).await?;
    control(&server, "-d").await?;
    let batch = scrape::commit_figures(&server)
        .await
        .map(|(batch, _)| batch)
        .unwrap_or(1.0);
    drop(server);
    let server = counted(
        "RequestApproval, SQLite, full, group commit",
        &dir,
        calls,
        format!("{batch:.1} changes/commit"),
        server_thread_kind,
    )?;

    let changes_per_commit = batch.round().max(1.0) as usize;
    eprintln!(
        "countersign-bench: instructions of the storage floor ({changes_per_commit} per commit)"
    );
    let dir = directory(scratch, "floor")?;
    let floor = floor_counted(
        binary,
        &dir,
        log_level,
        changes_per_commit,
        warmup_calls,
        calls,
        load,
    )
    .await?;

    let writer_vs_floor = server.kind("writer") / floor.per_call.max(1.0);
    let server_vs_budget = server.per_call / (4.0 * echo.per_call + floor.per_call).max(1.0);
    Ok(Instructions {
        calls,
        warmup_calls,
        concurrency: load.concurrency,
        connections: load.connections,
        echo,
        server,
        floor,
        writer_vs_floor,
        server_vs_budget,
    })
}

/// New approvals, failing the count if any call failed (failed calls cost less).
async fn requests(server: &Served, load: &Load) -> Result<(), BenchError> {
    let summary = figures::request_throughput(&server.url(), load).await?;
    match summary.first_error {
        Some(error) => Err(BenchError::Setup(format!(
            "{} RequestApproval calls failed, the first: {error}",
            summary.errors
        ))),
        None => Ok(()),
    }
}

/// The floor: a server (not counted) creates and migrates the database and writes the
/// template approval; then this executable writes the floor's changes under callgrind
/// (hidden `--floor-process`), pausing after the unmeasured ones until told to go on.
async fn floor_counted(
    binary: &Path,
    dir: &Path,
    log_level: &str,
    batch: usize,
    warmup_changes: u64,
    changes: u64,
    load: &Load,
) -> Result<Counted, BenchError> {
    let settings = ServerSettings {
        durability: "full",
        group_commit: true,
        log_level: log_level.to_string(),
    };
    let database = dir.join("countersign.db");
    let server =
        process::start_server(binary, dir, &database.display().to_string(), &settings).await?;
    let (_, id, key) = figures::template_request(&server.url(), "floor").await?;
    server.stop().await?;
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Setup(format!("cannot find the bench executable: {e}")))?;
    let under = callgrind(dir);
    let mut child = Command::new(&under[0])
        .args(&under[1..])
        .arg(exe)
        .arg("--floor-process")
        .arg(&database)
        .args(["--floor-template", &id, "--floor-key", &key])
        .args(["--floor-batch", &batch.to_string()])
        .args(["--floor-warmup", &warmup_changes.to_string()])
        .args(["--instructions", &changes.to_string()])
        .args(["--concurrency", &load.concurrency.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Setup(format!("cannot start the floor under valgrind: {e}")))?;
    let pid = child
        .id()
        .ok_or_else(|| BenchError::Setup("the floor exited at once".into()))?;
    let (Some(mut input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(BenchError::Setup("the floor has no stdin or stdout".into()));
    };
    let mut lines = BufReader::new(output).lines();
    let mut expect = async |word: &str| -> Result<(), BenchError> {
        match lines.next_line().await {
            Ok(Some(line)) if line == word => Ok(()),
            other => Err(BenchError::Setup(format!(
                "the floor said {other:?}, not {word:?}"
            ))),
        }
    };
    expect(FLOOR_WARM).await?;
    control_pid(pid, "-z").await?;
    go_on(&mut input).await?;
    expect(FLOOR_DONE).await?;
    control_pid(pid, "-d").await?;
    go_on(&mut input).await?;
    drop(input);
    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    counted(
        "storage floor, SQLite, full (per change)",
        dir,
        changes,
        format!("{batch} changes/commit, the rows made too"),
        |_| "floor".into(),
    )
}

async fn go_on(input: &mut tokio::process::ChildStdin) -> Result<(), BenchError> {
    input
        .write_all(b"\n")
        .await
        .map_err(|e| BenchError::Setup(format!("cannot tell the floor to go on: {e}")))
}

/// What the floor process prints once its unmeasured changes are written.
pub const FLOOR_WARM: &str = "warm";
/// What it prints once the measured ones are.
pub const FLOOR_DONE: &str = "done";

/// The hidden `--floor-process` mode: the floor's SQLite writes on `database`, `warmup`
/// changes, then (after a line on stdin) `changes` more, then waits for a last line.
pub fn floor_process(
    database: &Path,
    template: floor::Template,
    batch: usize,
    warmup: u64,
    changes: u64,
    concurrency: usize,
) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(format!("cannot start the async runtime: {e}")))?;
    let load = |calls| Load {
        concurrency,
        connections: 1,
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        calls: Some(calls),
    };
    let wait_for_a_line = || {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map(drop)
            .map_err(|e| BenchError::Setup(format!("reading stdin: {e}")))
    };
    runtime.block_on(async {
        let storage = || floor::Storage::Sqlite(database);
        floor::request_writes(storage(), &template, batch, &load(warmup)).await?;
        println!("{FLOOR_WARM}");
        wait_for_a_line()?;
        floor::request_writes(storage(), &template, batch, &load(changes)).await?;
        println!("{FLOOR_DONE}");
        wait_for_a_line()
    })
}

/// A thread's kind, from the functions it ran (their names are in its profile): the writer's
/// loop, a tokio worker's loop, statements run by sqlx's SQLite worker; else "other" (the main
/// thread blocked in the runtime, the blocking pool).
fn server_thread_kind(profile: &str) -> String {
    let kind = if profile.contains("store::writer::Writer::run") {
        "writer"
    } else if profile.contains("tokio::runtime::scheduler::multi_thread::worker::run") {
        "tokio"
    } else if profile.contains("sqlx_sqlite::connection::execute") {
        "sqlite"
    } else {
        "other"
    };
    kind.into()
}

fn directory(scratch: &Path, name: &str) -> Result<PathBuf, BenchError> {
    let dir = scratch.join(format!("instructions-{name}"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::Setup(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// valgrind's command line: callgrind, a profile per thread, written into `dir`.
fn callgrind(dir: &Path) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--separate-threads=yes".into(),
        format!(
            "--callgrind-out-file={}",
            dir.join("callgrind.out").display()
        ),
        // Under valgrind a thread runs only while it holds valgrind's lock: hand it on fairly,
        // or one thread can starve the others.
        "--fair-sched=yes".into(),
        "--log-file=".to_string() + &dir.join("valgrind.log").display().to_string(),
    ]
}

async fn check_tools() -> Result<(), BenchError> {
    for tool in ["valgrind", "callgrind_control"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .await
            .is_ok_and(|status| status.success());
        if !found {
            return Err(BenchError::Setup(format!(
                "--instructions needs {tool} (valgrind's package)"
            )));
        }
    }
    Ok(())
}

async fn control(served: &Served, option: &str) -> Result<(), BenchError> {
    let pid = served
        .pid()
        .ok_or_else(|| BenchError::Setup("the process under callgrind has exited".into()))?;
    control_pid(pid, option).await
}

/// `callgrind_control OPTION PID`: -z zeroes the counters, -d dumps them.
async fn control_pid(pid: u32, option: &str) -> Result<(), BenchError> {
    let output = Command::new("callgrind_control")
        .arg(option)
        .arg(pid.to_string())
        .output()
        .await
        .map_err(|e| BenchError::Setup(format!("cannot run callgrind_control: {e}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(BenchError::Setup(format!(
            "callgrind_control {option} {pid}: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// The first dump's files in `dir` (one per thread), summed by the kind `kind_of` reads from
/// each file, over `calls`.
fn counted(
    name: &str,
    dir: &Path,
    calls: u64,
    note: String,
    kind_of: impl Fn(&str) -> String,
) -> Result<Counted, BenchError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| BenchError::Setup(format!("cannot list {}: {e}", dir.display())))?;
    let mut by_thread: Vec<(String, f64)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("callgrind.out") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let header = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(key))
                .map(str::trim)
        };
        if header("part:") != Some("1") {
            continue;
        }
        let Some(instructions) = header("summary:")
            .or_else(|| header("totals:"))
            .and_then(|n| n.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
        else {
            continue;
        };
        let kind = kind_of(&text);
        match by_thread.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, total)) => *total += instructions,
            None => by_thread.push((kind, instructions)),
        }
    }
    if by_thread.is_empty() {
        return Err(BenchError::Setup(format!(
            "no callgrind dump in {}",
            dir.display()
        )));
    }
    for (_, total) in &mut by_thread {
        *total /= calls as f64;
    }
    by_thread.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(Counted {
        name: name.to_string(),
        per_call: by_thread.iter().map(|(_, n)| n).sum(),
        by_thread,
        note,
    })
}
