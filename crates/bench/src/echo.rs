//! The baseline: a trivial tonic echo service, run as its own process like the real server
//! and served the same way (multi-threaded runtime, same transport settings and listener).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

pub mod pb {
    tonic::include_proto!("countersign.bench.v1");
}

use pb::echo_server::{Echo, EchoServer};

struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(
        &self,
        request: Request<pb::EchoMessage>,
    ) -> Result<Response<pb::EchoMessage>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

/// The hidden `--echo-server ADDR` mode: prints `listening ADDR` once bound, then serves
/// until killed.
pub fn run(listen: SocketAddr) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("echo server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(listen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo server: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(listen: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(listen).await?;
    println!("listening {}", listener.local_addr()?);
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(EchoServer::new(EchoService))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await?;
    Ok(())
}
