//! A private PostgreSQL cluster for tests: initialized from the PostgreSQL binaries on the
//! machine (`/usr/lib/postgresql/*/bin`) in a temporary directory, listening on 127.0.0.1 on a
//! free port, shared by tests (one database each). `scripts/test` starts one for its whole
//! PostgreSQL pass (`countersign-test-postgres`) and names its port in
//! `COUNTERSIGN_TEST_POSTGRES_PORT`, since nextest runs each test in a process of its own;
//! without that variable, a test process starts its own on first use.
//!
//! `initdb` refuses root, so as root the cluster runs as the `postgres` user (`runuser`). A
//! watchdog process stops the cluster and deletes its directory as soon as the process it
//! belongs to is gone, however it ended (Rust runs no destructors of statics at exit, and a
//! killed test process runs none at all).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use sqlx::Connection;

/// The environment variable that selects the backend of [`crate::server::TestServer`]:
/// `postgres` for the shared private cluster; anything else (or unset) for SQLite.
pub const BACKEND_VARIABLE: &str = "COUNTERSIGN_TEST_BACKEND";

/// The port of a cluster shared by every test process of a run, started by `scripts/test`.
pub const CLUSTER_PORT_VARIABLE: &str = "COUNTERSIGN_TEST_POSTGRES_PORT";

/// Whether this test run uses PostgreSQL (`COUNTERSIGN_TEST_BACKEND=postgres`). A test that
/// asks depends on its backend: it is noted as one (see [`crate::storage_use`]).
pub fn enabled() -> bool {
    crate::storage_use::note();
    selected()
}

/// [`enabled`], without noting the test: for the test kit's own choice of a database.
pub(crate) fn selected() -> bool {
    std::env::var(BACKEND_VARIABLE).is_ok_and(|backend| backend == "postgres")
}

/// For a test that only makes sense on SQLite (it edits the database file, fills its disk,
/// or upgrades an old SQLite file): true, with a note saying why it is skipped, when the run
/// is on PostgreSQL.
pub fn skip_unless_sqlite(reason: &str) -> bool {
    let skip = enabled();
    if skip {
        eprintln!("skipped on PostgreSQL: {reason}");
    }
    skip
}

pub struct Cluster {
    port: u16,
    /// The directory of a cluster this process started, kept for its lifetime; the
    /// watchdog deletes it.
    _dir: Option<PathBuf>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(0);

impl Cluster {
    /// The run's cluster named by `COUNTERSIGN_TEST_POSTGRES_PORT`, or else the process's
    /// own, started on first use.
    pub fn shared() -> &'static Cluster {
        crate::storage_use::note();
        CLUSTER.get_or_init(|| {
            let shared = std::env::var(CLUSTER_PORT_VARIABLE).ok().map(|port| {
                port.parse::<u16>()
                    .map(|port| Cluster { port, _dir: None })
                    .map_err(|e| format!("{CLUSTER_PORT_VARIABLE}={port:?}: {e}"))
            });
            shared
                .unwrap_or_else(|| Cluster::start(std::process::id()))
                .unwrap_or_else(|e| panic!("test PostgreSQL: {e}"))
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a new, empty database and returns its URL.
    pub async fn create_database(&self) -> String {
        // The cluster serves every test process of a run: the start time keeps a reused
        // process id from naming a database an earlier test made.
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let name = format!(
            "test_{}_{started}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect to the test cluster");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create a test database");
        conn.close().await.ok();
        self.url(&name)
    }

    /// Starts a cluster that stops, and whose directory is deleted, once process `owner`
    /// has ended.
    pub fn start(owner: u32) -> Result<Cluster, String> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("countersign-pg-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?
            .keep();
        let data = dir.join("data");
        let as_root = run_output(Command::new("id").arg("-u"))?.trim() == "0";
        if as_root {
            // The cluster's files belong to the unprivileged user it runs as.
            run(Command::new("chown").arg("postgres:").arg(&dir))?;
        }
        let port = free_port()?;
        let postgres_command = |program: &str| {
            let mut command = if as_root {
                let mut command = Command::new("runuser");
                command
                    .args(["-u", "postgres", "--"])
                    .arg(bin.join(program));
                command
            } else {
                Command::new(bin.join(program))
            };
            command.current_dir(&dir);
            command
        };
        run(postgres_command("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]))?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={} -c max_connections=400",
            dir.display()
        );
        run(postgres_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-o")
            .arg(options)
            .arg("-l")
            .arg(dir.join("log"))
            .args(["-w", "start"]))?;
        watch_over(owner, &bin, &dir, &data, as_root)?;
        Ok(Cluster {
            port,
            _dir: Some(dir),
        })
    }
}

/// The newest PostgreSQL version's binaries on the machine.
fn binaries() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no PostgreSQL under /usr/lib/postgresql ({e}); install Debian's postgresql package"))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".to_string())
}

/// Starts the watchdog: a detached shell that waits for process `owner` to end, then stops
/// the cluster at once and deletes its directory.
fn watch_over(
    owner: u32,
    bin: &Path,
    dir: &Path,
    data: &Path,
    as_root: bool,
) -> Result<(), String> {
    let stop = format!(
        "{}{} -D {} -m immediate stop",
        if as_root {
            "runuser -u postgres -- "
        } else {
            ""
        },
        bin.join("pg_ctl").display(),
        data.display()
    );
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
        pid = owner,
        dir = dir.display()
    );
    Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("cannot start the watchdog: {e}"))
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| e.to_string())
}

fn run(command: &mut Command) -> Result<(), String> {
    run_output(command).map(drop)
}

fn run_output(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
