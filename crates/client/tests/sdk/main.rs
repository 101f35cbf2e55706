//! Tests of the SDK against a real countersign server on an ephemeral port (and, to see the
//! headers a call carries, a minimal HTTP/2 server).

mod receipts;
mod request_and_wait;
mod rpcs;
mod support;
mod tls;
mod token;
mod watch;
