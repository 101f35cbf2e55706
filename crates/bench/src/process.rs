//! The processes the bench measures: the real `countersign-server` binary and the echo
//! baseline, each started the same way, on loopback, as a child of the bench.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::error::BenchError;

const START_PATIENCE: Duration = Duration::from_secs(60);

/// Time a thread (or the threads of one name) ran, and waited runnable for a CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadTimes {
    pub cpu: Duration,
    pub waited: Duration,
}

/// How the measured server is configured.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub durability: &'static str,
    pub group_commit: bool,
    pub log_level: String,
}

impl ServerSettings {
    /// The server's configuration file. Per-agent limits are off: the bench is one agent
    /// per loop sending as fast as it can, which they exist to stop.
    fn config_toml(&self, metrics: SocketAddr) -> String {
        format!(
            "[log]\nlevel = \"{}\"\n\n[storage]\ndurability = \"{}\"\ngroup_commit = {}\n\n\
             [limits]\nrequests_per_minute = 0\ndecisions_per_minute = 0\nmax_pending_per_agent = 0\n\n\
             [metrics]\nlisten = \"{metrics}\"\n",
            self.log_level, self.durability, self.group_commit
        )
    }
}

/// A child process serving gRPC on `addr`, killed when dropped.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
    /// The server's Prometheus endpoint (the echo baseline has none).
    pub metrics: Option<SocketAddr>,
    log: Option<PathBuf>,
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident memory of the process, from `/proc`.
    pub fn rss_bytes(&self) -> Result<u64, BenchError> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| BenchError::Setup("the process has exited".into()))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| BenchError::Setup(format!("cannot read /proc/{pid}/status: {e}")))?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .ok_or_else(|| BenchError::Setup("no VmRSS in /proc status".into()))
    }

    /// Time the process's threads have run so far and waited, runnable, for a CPU, by thread
    /// name (tokio workers, SQLite workers, …), from `/proc`. The wait is 0 where the kernel
    /// keeps no scheduler statistics.
    pub fn times_by_thread(&self) -> Result<Vec<(String, ThreadTimes)>, BenchError> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| BenchError::Setup("the process has exited".into()))?;
        // SAFETY: sysconf has no memory effects.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| BenchError::Setup(format!("cannot list threads of {pid}: {e}")))?;
        let mut by_name: Vec<(String, ThreadTimes)> = Vec::new();
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // "pid (name) state ppid …": fields after the name, utime and stime are 12th and 13th.
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                continue;
            };
            let name = head
                .split_once(" (")
                .map(|(_, n)| n)
                .unwrap_or("?")
                .to_string();
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks: u64 = [11, 12]
                .iter()
                .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
                .sum();
            // "run-time wait-time timeslices", in nanoseconds: the second is time spent
            // runnable on a run queue.
            let waited_ns: u64 = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0);
            let times = ThreadTimes {
                cpu: Duration::from_secs_f64(ticks as f64 / ticks_per_second),
                waited: Duration::from_nanos(waited_ns),
            };
            match by_name.iter_mut().find(|(n, _)| *n == name) {
                Some((_, total)) => {
                    total.cpu += times.cpu;
                    total.waited += times.waited;
                }
                None => by_name.push((name, times)),
            }
        }
        Ok(by_name)
    }

    /// Bytes the process caused to be written to storage so far (`write_bytes` of
    /// `/proc/PID/io`: the database, its WAL and its log file, as the kernel sends them to
    /// the disk).
    pub fn bytes_written(&self) -> Result<u64, BenchError> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| BenchError::Setup("the process has exited".into()))?;
        let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
            .map_err(|e| BenchError::Setup(format!("cannot read /proc/{pid}/io: {e}")))?;
        io.lines()
            .find_map(|line| line.strip_prefix("write_bytes:"))
            .and_then(|value| value.trim().parse().ok())
            .ok_or_else(|| BenchError::Setup("no write_bytes in /proc io".into()))
    }

    /// SIGTERM, then the process's graceful shutdown; SIGKILL if that takes too long.
    pub async fn stop(mut self) -> Result<(), BenchError> {
        if let Some(pid) = self.child.id() {
            let pid = libc::pid_t::try_from(pid)
                .map_err(|_| BenchError::Setup(format!("pid {pid} out of range")))?;
            // SAFETY: kill(2) with a pid of our own child has no memory effects.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(BenchError::Setup(format!("waiting for the server: {e}"))),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(BenchError::Setup(
                    "the server did not stop within 30 s of SIGTERM".into(),
                ))
            }
        }
    }

    fn log_tail(&self) -> String {
        let Some(path) = &self.log else {
            return String::new();
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// A loopback port that was free a moment ago. The server binds it itself, so there is a
/// short window in which another process could take it; start-up then fails loudly.
fn free_port() -> Result<SocketAddr, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::Setup(format!("cannot bind loopback: {e}")))?;
    listener
        .local_addr()
        .map_err(|e| BenchError::Setup(format!("no local address: {e}")))
}

/// Creates database number `number` of this run beside the one `url` names, and returns its
/// URL.
pub async fn create_postgres_database(url: &str, number: usize) -> Result<String, BenchError> {
    let name = postgres_database_name(number);
    let mut conn = connect_postgres(url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .map_err(|e| BenchError::Setup(format!("cannot create database {name}: {e}")))?;
    // postgres://user@host:port[/database][?options]: the same server, the new database.
    let (base, options) = match url.split_once('?') {
        Some((base, options)) => (base, format!("?{options}")),
        None => (url, String::new()),
    };
    let authority_at = base.find("://").map_or(0, |at| at + 3);
    let server = match base[authority_at..].find('/') {
        Some(slash) => &base[..authority_at + slash],
        None => base,
    };
    Ok(format!("{server}/{name}{options}"))
}

/// Drops databases `numbers` of this run from the server `url` names, ending any connection
/// to them first.
pub async fn drop_postgres_databases(url: &str, numbers: &[usize]) -> Result<(), BenchError> {
    let mut conn = connect_postgres(url).await?;
    for name in numbers.iter().map(|&number| postgres_database_name(number)) {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .map_err(|e| BenchError::Setup(format!("cannot drop database {name}: {e}")))?;
    }
    Ok(())
}

/// Database `number` of this run (the process id keeps runs side by side apart).
fn postgres_database_name(number: usize) -> String {
    format!("countersign_bench_{}_{number}", std::process::id())
}

async fn connect_postgres(url: &str) -> Result<sqlx::PgConnection, BenchError> {
    use sqlx::Connection;
    sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| BenchError::Setup(format!("cannot connect to {url}: {e}")))
}

/// Starts `countersign-server` on `database` (a SQLite file or a PostgreSQL URL), its config
/// and log in `dir`, and waits until its health service says SERVING.
pub async fn start_server(
    binary: &Path,
    dir: &Path,
    database: &str,
    settings: &ServerSettings,
) -> Result<Served, BenchError> {
    start_server_under(&[], binary, dir, database, settings).await
}

/// [`start_server`] run by the command `under` (a tool and its options, such as valgrind's;
/// empty: none), which must exec the server in its own process.
pub async fn start_server_under(
    under: &[String],
    binary: &Path,
    dir: &Path,
    database: &str,
    settings: &ServerSettings,
) -> Result<Served, BenchError> {
    let addr = free_port()?;
    let metrics = free_port()?;
    let config = dir.join("countersign.toml");
    // The receipt keys in the run's directory (on PostgreSQL they would go to the working
    // directory).
    // A JSON string is a TOML basic string.
    let keys_dir = serde_json::Value::String(dir.display().to_string());
    let text = format!(
        "{}\n[receipts]\nkeys_dir = {keys_dir}\n",
        settings.config_toml(metrics)
    );
    std::fs::write(&config, text)
        .map_err(|e| BenchError::Setup(format!("cannot write {}: {e}", config.display())))?;
    let log = dir.join("server.log");
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| BenchError::Setup(format!("cannot open {}: {e}", log.display())))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| BenchError::Setup(format!("cannot open {}: {e}", log.display())))?;
    let child = command_under(under, binary)
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--database")
        .arg(database)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Setup(format!("cannot start {}: {e}", binary.display())))?;
    let mut served = Served {
        child,
        addr,
        metrics: Some(metrics),
        log: Some(log),
    };
    wait_until_serving(&mut served).await?;
    Ok(served)
}

async fn wait_until_serving(served: &mut Served) -> Result<(), BenchError> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let deadline = Instant::now() + START_PATIENCE;
    loop {
        if let Ok(Some(status)) = served.child.try_wait() {
            return Err(BenchError::Setup(format!(
                "countersign-server exited during start-up ({status}):\n{}",
                served.log_tail()
            )));
        }
        let endpoint = tonic::transport::Endpoint::from_shared(served.url())
            .map_err(|e| BenchError::Setup(e.to_string()))?;
        if let Ok(channel) = endpoint.connect().await {
            let answer = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: countersign_proto::v1::approval_service_server::SERVICE_NAME.into(),
                })
                .await;
            if matches!(answer, Ok(a) if a.get_ref().status == ServingStatus::Serving as i32) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::Setup(format!(
                "countersign-server did not become healthy within {START_PATIENCE:?}:\n{}",
                served.log_tail()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `program` run by the command `under` (empty: on its own).
fn command_under(under: &[String], program: &Path) -> Command {
    match under.split_first() {
        Some((tool, options)) => {
            let mut command = Command::new(tool);
            command.args(options).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Starts this executable again as the echo baseline (hidden `--echo-server` flag) and reads
/// the address it bound from its first line of output.
pub async fn start_echo() -> Result<Served, BenchError> {
    start_echo_under(&[]).await
}

/// [`start_echo`] run by the command `under`, as in [`start_server_under`].
pub async fn start_echo_under(under: &[String]) -> Result<Served, BenchError> {
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Setup(format!("cannot find the bench executable: {e}")))?;
    let mut child = command_under(under, &exe)
        .arg("--echo-server")
        .arg("127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Setup(format!("cannot start the echo server: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Setup("the echo server has no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_PATIENCE, lines.next_line())
        .await
        .map_err(|_| BenchError::Setup("the echo server did not start".into()))?
        .map_err(|e| BenchError::Setup(format!("reading the echo server: {e}")))?
        .ok_or_else(|| BenchError::Setup("the echo server exited during start-up".into()))?;
    let addr = first
        .strip_prefix("listening ")
        .and_then(|a| a.trim().parse().ok())
        .ok_or_else(|| BenchError::Setup(format!("unexpected echo server output {first:?}")))?;
    Ok(Served {
        child,
        addr,
        metrics: None,
        log: None,
    })
}

/// The server binary: `explicit`, else the one next to this executable. Under `cargo run`,
/// cargo builds it first with this executable's profile, so it is never stale or missing.
pub fn server_binary(explicit: Option<PathBuf>) -> Result<PathBuf, BenchError> {
    if let Some(path) = explicit {
        return Ok(path);
    }
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Setup(format!("cannot find the bench executable: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| BenchError::Setup("the bench executable has no directory".into()))?;
    if let Ok(cargo) = std::env::var("CARGO") {
        let profile = dir
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("debug");
        let mut build = std::process::Command::new(cargo);
        build.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--quiet",
            "-p",
            "countersign-server",
        ]);
        match profile {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        eprintln!("building countersign-server ({profile})…");
        let status = build
            .status()
            .map_err(|e| BenchError::Setup(format!("cannot run cargo: {e}")))?;
        if !status.success() {
            return Err(BenchError::Setup(format!(
                "building countersign-server failed ({status})"
            )));
        }
    }
    let binary = dir.join("countersign-server");
    if binary.exists() {
        Ok(binary)
    } else {
        Err(BenchError::Setup(format!(
            "no countersign-server next to the bench in {}: run the bench with `cargo run --release -p countersign-bench`, or pass --server-binary",
            dir.display()
        )))
    }
}

/// Raises this process's soft limit of open files to its hard limit (children inherit it),
/// for the many connections of the idle-stream figure.
pub fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}
