//! Starts an in-process countersign-server on an ephemeral loopback port with a temporary
//! database, for end-to-end tests.

use std::net::SocketAddr;
use std::path::PathBuf;

use countersign_server::config::Config;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    config: Config,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl TestServer {
    /// Test-friendly settings: expiry sweep every 50 ms, heartbeats every 500 ms.
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut config = Config {
            database: dir.path().join("countersign.db"),
            ..Config::default()
        };
        config.approvals.sweep_interval_ms = 50;
        config.watch.heartbeat_interval_ms = 500;
        adjust(&mut config);
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
        };
        server.launch(listener);
        server
    }

    fn launch(&mut self, listener: TcpListener) {
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
        self.running = Some((stop, task));
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn database_path(&self) -> PathBuf {
        self.config.database.clone()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Graceful shutdown; the database stays.
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            task.await.expect("test server task");
        }
    }

    /// Stops, then starts again on the same port and database.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = bind_again(self.addr).await;
        self.launch(listener);
    }
}

async fn bind_again(addr: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr).await {
            return listener;
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
