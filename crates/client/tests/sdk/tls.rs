//! TLS: the client verifies the server against the configured CA, over a TLS-terminating
//! proxy in front of a real server.

use countersign_client::{pb, Client, ClientConfig, ClientError};
use countersign_testkit::server::TestServer;

use crate::support::{request, tls_acceptor, Proxy};

#[tokio::test]
async fn https_works_with_the_servers_ca_and_fails_closed_without_it() {
    let server = TestServer::start().await;
    let (acceptor, ca_pem) = tls_acceptor();
    let proxy = Proxy::start_tls(server.addr(), acceptor).await;
    let url = format!("https://localhost:{}", proxy.addr().port());

    let mut trusted = ClientConfig::new(&url);
    trusted.ca_cert_pem = Some(ca_pem.into_bytes());
    let client = Client::connect(trusted).unwrap();
    let response = client.request_approval(request("tls-1")).await.unwrap();
    assert_eq!(
        response.approval.unwrap().state(),
        pb::ApprovalState::Pending
    );

    // The self-signed certificate is not in the public roots: no connection, no answer.
    let untrusting = Client::connect(ClientConfig::new(&url)).unwrap();
    let error = untrusting
        .request_approval(request("tls-2"))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Unavailable(_)), "{error:?}");
}
