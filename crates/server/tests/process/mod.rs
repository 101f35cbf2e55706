//! The real `countersign-server` binary as a child process on a fixed port and database, for
//! the tests that kill it and start it again.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tonic::transport::Channel;

pub const SERVER: &str = env!("CARGO_BIN_EXE_countersign-server");
pub const START_PATIENCE: Duration = Duration::from_secs(30);

/// The server binary on a fixed port and database, restarted after every kill.
pub struct Server {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// A SQLite file or a PostgreSQL URL.
    pub database: String,
    pub log: std::path::PathBuf,
    pub child: Option<Child>,
}

impl Server {
    pub fn new(dir: &Path, database: &str, number: usize) -> Server {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let metrics_probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Server {
            addr: probe.local_addr().unwrap(),
            metrics: metrics_probe.local_addr().unwrap(),
            database: database.to_string(),
            log: dir.join(format!("server-{number}.log")),
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // In the test's directory: a server on PostgreSQL keeps its receipt keys in its
        // working directory (the replicas of a test share them, as a deployment's do).
        let workdir = self.log.parent().unwrap_or(Path::new("."));
        let child = Command::new(SERVER)
            .current_dir(workdir)
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--database")
            .arg(&self.database)
            .arg("--metrics-listen")
            .arg(self.metrics.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_until_serving().await;
    }

    pub async fn wait_until_serving(&mut self) {
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "the server exited during start-up ({status}):\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if let Ok(channel) = Channel::from_shared(self.url()).unwrap().connect().await {
                let check = HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: "countersign.v1.ApprovalService".into(),
                    })
                    .await;
                if check.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the server did not start in time"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asks the server to stop cleanly (SIGTERM); [`Server::exited`] waits for it.
    pub fn terminate(&self) {
        let child = self.child.as_ref().expect("a running server");
        let pid = child.id().expect("the server has not been reaped") as libc::pid_t;
        // SAFETY: kill with the id of a child we spawned and have not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }

    /// Waits for the server to exit.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("a running server");
        child.wait().await.unwrap()
    }

    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }
}
