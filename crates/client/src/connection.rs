//! How the SDK connects: the settings ([`ClientConfig`]), the endpoint they make (TLS,
//! keep-alive), the bearer token on every call, and the [`Connector`] a client and its watches
//! share to open connections.

use std::fmt;
use std::time::Duration;

use countersign_proto::v1 as pb;
use pb::admin_service_client::AdminServiceClient;
use pb::approval_service_client::ApprovalServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::ClientError;

/// HTTP/2 pings detect a dead connection under a long-poll that sends nothing for a while.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to connect.
#[derive(Clone)]
pub struct ClientConfig {
    /// `http://host:port` (plaintext) or `https://host:port` (TLS).
    pub url: String,
    /// Bearer token sent with every call.
    pub token: Option<String>,
    /// PEM CA certificate(s) that sign the server's certificate (https only). Without it, an
    /// https server is verified against the public web PKI roots.
    pub ca_cert_pem: Option<Vec<u8>>,
    /// Limit on establishing the TCP (and TLS) connection.
    pub connect_timeout: Duration,
}

impl ClientConfig {
    /// No token, no custom CA, a 5 s connect timeout.
    pub fn new(url: impl Into<String>) -> Self {
        ClientConfig {
            url: url.into(),
            token: None,
            ca_cert_pem: None,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Shows everything except the token.
impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_cert_pem", &self.ca_cert_pem.as_ref().map(Vec::len))
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Adds `authorization: Bearer <token>` to every call when a token is configured.
#[derive(Clone)]
pub(crate) struct BearerAuth {
    header: Option<MetadataValue<Ascii>>,
}

impl BearerAuth {
    pub(crate) fn new(token: Option<&str>) -> Result<Self, ClientError> {
        let header = token
            .map(|token| {
                MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| {
                    ClientError::Config(
                        "the token contains characters not allowed in a header".into(),
                    )
                })
            })
            .transpose()?;
        Ok(BearerAuth { header })
    }
}

impl Interceptor for BearerAuth {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

pub(crate) type Rpc = ApprovalServiceClient<InterceptedService<Channel, BearerAuth>>;
pub(crate) type AdminRpc = AdminServiceClient<InterceptedService<Channel, BearerAuth>>;

/// The connection settings a [`crate::Watch`] needs to open fresh connections of its own.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) endpoint: Endpoint,
    pub(crate) auth: BearerAuth,
}

impl Connector {
    /// A client on a new connection (made on first use).
    pub(crate) fn fresh_rpc(&self) -> Rpc {
        ApprovalServiceClient::with_interceptor(self.endpoint.connect_lazy(), self.auth.clone())
    }
}

pub(crate) fn endpoint(config: &ClientConfig) -> Result<Endpoint, ClientError> {
    let tls = if config.url.starts_with("https://") {
        true
    } else if config.url.starts_with("http://") {
        false
    } else {
        return Err(ClientError::Config(format!(
            "server URL {:?} must start with http:// or https://",
            config.url
        )));
    };
    let endpoint = Endpoint::from_shared(config.url.clone())
        .map_err(|error| ClientError::Config(format!("server URL {:?}: {error}", config.url)))?
        .connect_timeout(config.connect_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
    if !tls {
        if config.ca_cert_pem.is_some() {
            // Refuse rather than silently talk plaintext to a server meant to be verified.
            return Err(ClientError::Config(
                "a CA certificate is configured but the server URL is http://; use https://".into(),
            ));
        }
        return Ok(endpoint);
    }
    let tls_config = match &config.ca_cert_pem {
        Some(pem) => {
            if !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ClientError::Config(
                    "the CA certificate holds no PEM certificate".into(),
                ));
            }
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
        }
        None => ClientTlsConfig::new().with_webpki_roots(),
    };
    endpoint
        .tls_config(tls_config)
        .map_err(|error| ClientError::Config(format!("TLS configuration: {error}")))
}
