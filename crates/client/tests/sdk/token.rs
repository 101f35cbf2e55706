//! The bearer token reaches the server with every call: a minimal HTTP/2 server records the
//! headers of the gRPC call it receives and answers NOT_FOUND.

use countersign_client::{Client, ClientConfig, ClientError};
use tokio::net::TcpListener;

/// Accepts one connection, answers its first gRPC call with NOT_FOUND, and returns the
/// `authorization` header the call carried.
async fn record_authorization(listener: TcpListener) -> Option<String> {
    let (socket, _) = listener.accept().await.unwrap();
    let mut connection = h2::server::handshake(socket).await.unwrap();
    let (request, mut respond) = connection.accept().await.unwrap().unwrap();
    let authorization = request
        .headers()
        .get("authorization")
        .map(|value| value.to_str().unwrap().to_owned());
    let response = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("grpc-status", "5")
        .header("grpc-message", "no such approval")
        .body(())
        .unwrap();
    respond.send_response(response, true).unwrap();
    // Serve the connection until the client has read the answer and gone.
    tokio::spawn(async move { while connection.accept().await.is_some() {} });
    authorization
}

#[tokio::test]
async fn every_call_carries_the_bearer_token() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = ClientConfig::new(format!("http://{}", listener.local_addr().unwrap()));
    config.token = Some("t0ken-for-test".into());
    let recording = tokio::spawn(record_authorization(listener));

    let client = Client::connect(config).unwrap();
    let error = client.get_approval("some-id").await.unwrap_err();
    assert!(
        matches!(error, ClientError::NotFound(ref message) if message == "no such approval"),
        "{error:?}"
    );
    assert_eq!(
        recording.await.unwrap().as_deref(),
        Some("Bearer t0ken-for-test")
    );
}

#[tokio::test]
async fn without_a_token_no_authorization_header_is_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ClientConfig::new(format!("http://{}", listener.local_addr().unwrap()));
    let recording = tokio::spawn(record_authorization(listener));
    let client = Client::connect(config).unwrap();
    assert!(client.get_approval("some-id").await.is_err());
    assert_eq!(recording.await.unwrap(), None);
}
