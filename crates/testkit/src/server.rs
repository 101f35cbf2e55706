//! Starts an in-process countersign-server on an ephemeral loopback port with a temporary
//! database, for end-to-end tests; and makes the tokens and TLS certificates such tests
//! configure it with.

use std::net::SocketAddr;
use std::path::PathBuf;

use countersign_server::config::{Config, Role, TlsConfig, TokenConfig};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::postgres;

pub struct TestServer {
    config: Config,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    /// While stopped: the port, bound but not listening (a connection is refused, as by a
    /// stopped server), so that no other test process's server is given it meanwhile and
    /// answers this test's clients; `restart` listens on it again.
    reserved: Option<TcpSocket>,
}

impl TestServer {
    /// Test-friendly settings: expiry sweep every 50 ms, heartbeats every 500 ms.
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    /// With the approvers, rules and tokens (or any section) of a server TOML file; the test
    /// settings above still apply. For crates that test against the server without depending
    /// on its config types.
    pub async fn start_with_toml(toml: &str) -> TestServer {
        let parsed = Config::parse(toml).expect("test server TOML");
        TestServer::start_with(|config| {
            let test_defaults = (
                config.database.clone(),
                config.approvals.clone(),
                config.watch.clone(),
            );
            *config = parsed;
            (config.database, config.approvals, config.watch) = test_defaults;
        })
        .await
    }

    /// On SQLite in a temporary directory, or, with `COUNTERSIGN_TEST_BACKEND=postgres`, on a
    /// new database of the process's private PostgreSQL cluster.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let database = if postgres::selected() {
            PathBuf::from(postgres::Cluster::shared().create_database().await)
        } else {
            dir.path().join("countersign.db")
        };
        let mut config = Config {
            database,
            ..Config::default()
        };
        config.approvals.sweep_interval_ms = 50;
        config.watch.heartbeat_interval_ms = 500;
        adjust(&mut config);
        // The receipt keys in the test's own directory (not the working directory).
        if config.receipts.keys_dir.is_none() {
            config.receipts.keys_dir = Some(dir.path().to_path_buf());
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        config.listen = addr;
        let mut server = TestServer {
            config,
            addr,
            _dir: dir,
            running: None,
            reserved: None,
        };
        server.launch(listener).await;
        server
    }

    /// Runs the server in a task; returns once its `[http]` and `[metrics]` listeners, where
    /// configured, take connections (the server binds them as it starts, after the gRPC
    /// listener the test bound).
    async fn launch(&mut self, listener: TcpListener) {
        let (stop, stopped) = oneshot::channel::<()>();
        let config = self.config.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = countersign_server::serve(config, listener, shutdown).await {
                panic!("test server failed: {e}");
            }
        });
        let own_listeners = [self.config.http.listen, self.config.metrics.listen];
        self.running = Some((stop, task));
        for addr in own_listeners.into_iter().flatten() {
            self.wait_for_listener(addr).await;
        }
    }

    async fn wait_for_listener(&self, addr: SocketAddr) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            let ended = self
                .running
                .as_ref()
                .is_none_or(|(_, task)| task.is_finished());
            assert!(
                !ended,
                "the test server stopped before its listener on {addr} took a connection"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "the test server's listener on {addr} took no connection in 30 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL for a server configured with [`TestCertificates`] (whose certificate names
    /// `localhost`).
    pub fn https_url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The SQLite file, or the PostgreSQL URL, the server stores in.
    pub fn database_path(&self) -> PathBuf {
        crate::storage_use::note();
        self.config.database.clone()
    }

    /// Runs `sql` on the server's database by hand, as someone with access to the file or
    /// the database would (tests of tampering), on either backend; the rows it changed.
    pub async fn tamper(&self, sql: &str) -> u64 {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let database = self.database_path().to_string_lossy().to_string();
        let url = if database.starts_with("postgres") {
            database
        } else {
            format!("sqlite://{database}")
        };
        let mut connection = sqlx::AnyConnection::connect(&url)
            .await
            .expect("open the database");
        sqlx::query(sql)
            .execute(&mut connection)
            .await
            .expect("the SQL runs")
            .rows_affected()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Graceful shutdown; the database stays, and the port stays this server's.
    pub async fn stop(&mut self) {
        crate::storage_use::note();
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            task.await.expect("test server task");
            self.reserved = Some(reserve(self.addr).await);
        }
    }

    /// Stops, then starts again on the same port and database.
    pub async fn restart(&mut self) {
        crate::storage_use::note();
        self.stop().await;
        let socket = match self.reserved.take() {
            Some(socket) => socket,
            None => reserve(self.addr).await,
        };
        let listener = socket.listen(1024).expect("listen on the port again");
        self.launch(listener).await;
    }
}

/// A socket bound to `addr` and not listening. The server's closed connections may hold the
/// port briefly (TIME_WAIT), which SO_REUSEADDR allows, as the server's own bind does.
async fn reserve(addr: SocketAddr) -> TcpSocket {
    for _ in 0..100 {
        let socket = TcpSocket::new_v4().expect("a TCP socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        if socket.bind(addr).is_ok() {
            return socket;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("cannot bind {addr} again");
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some((stop, _task)) = self.running.take() {
            let _ = stop.send(());
        }
    }
}

/// A `[[tokens]]` entry for `secret`, configured as its SHA-256. `scope` is the agent ids of an
/// agent token or the channels of a worker token.
pub fn token(name: &str, role: Role, scope: &[&str], secret: &str) -> TokenConfig {
    let scope: Vec<String> = scope.iter().map(|s| s.to_string()).collect();
    TokenConfig {
        name: name.to_string(),
        role,
        agents: if role == Role::Agent {
            scope.clone()
        } else {
            Vec::new()
        },
        channels: if role == Role::Worker {
            scope
        } else {
            Vec::new()
        },
        value_env: None,
        sha256: Some(hex::encode(Sha256::digest(secret.as_bytes()))),
    }
}

/// A test CA and a server certificate it signed for `localhost` and 127.0.0.1, with the
/// certificate and key written to files for the server's `[tls]` section.
pub struct TestCertificates {
    /// The CA certificate clients trust, PEM.
    pub ca_pem: String,
    dir: tempfile::TempDir,
}

impl TestCertificates {
    pub fn generate() -> TestCertificates {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "countersign test CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server certificate parameters");
        let server_key = KeyPair::generate().expect("server key");
        let server = server_params
            .signed_by(&server_key, &ca, &ca_key)
            .expect("server certificate");
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("server.pem"), server.pem()).expect("write certificate");
        std::fs::write(dir.path().join("server.key"), server_key.serialize_pem())
            .expect("write key");
        TestCertificates {
            ca_pem: ca.pem(),
            dir,
        }
    }

    /// The server's `[tls]` section.
    pub fn tls_config(&self) -> TlsConfig {
        TlsConfig {
            cert_file: self.dir.path().join("server.pem"),
            key_file: self.dir.path().join("server.key"),
        }
    }
}
