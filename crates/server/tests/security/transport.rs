//! Where the server listens and how: the loopback rule without tokens, and TLS.

use super::*;

#[tokio::test]
async fn a_non_loopback_address_needs_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let open = Config {
        database: dir.path().join("open.db"),
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = tokio::time::timeout(
        PATIENCE,
        countersign_server::serve(open, listener, std::future::pending()),
    )
    .await
    .expect("the server refuses to start instead of serving");
    let error = refused.unwrap_err().to_string();
    assert!(error.contains("without tokens"), "{error}");
    assert!(
        !dir.path().join("open.db").exists(),
        "refused before opening the database"
    );

    // With tokens it serves on any address.
    let guarded = Config {
        database: dir.path().join("guarded.db"),
        tokens: tokens(),
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(countersign_server::serve(guarded, listener, async {
        let _ = stopped.await;
    }));
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let created = with_token(&channel, Some(CODER))
        .request_approval(request("agent-a", "call-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn tls_clients_with_the_ca_connect_and_plaintext_clients_fail() {
    let certificates = TestCertificates::generate();
    let server = TestServer::start_with(|c| c.tls = Some(certificates.tls_config())).await;

    let trusted = Endpoint::from_shared(server.https_url())
        .unwrap()
        .tls_config(
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&certificates.ca_pem)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let created = with_token(&trusted, None)
        .request_approval(request("agent-a", "tls-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);

    let plaintext = Endpoint::from_shared(server.url()).unwrap().connect().await;
    let refused = match plaintext {
        Err(_) => true,
        Ok(channel) => with_token(&channel, None)
            .request_approval(request("agent-a", "tls-2"))
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext client got an answer");

    let untrusting = Endpoint::from_shared(server.https_url())
        .unwrap()
        .tls_config(ClientTlsConfig::new())
        .unwrap()
        .connect()
        .await;
    assert!(untrusting.is_err(), "a client without the CA connected");
    assert_eq!(count_rows(&server, "approvals").await, 1);
}
