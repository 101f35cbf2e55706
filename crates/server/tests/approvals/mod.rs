//! The approval lifecycle through gRPC over a real socket.

use crate::common;
mod decisions;
mod input_and_lists;
mod lifecycle;
mod withdrawal;

use std::time::{Duration, Instant};

use common::*;
use countersign_proto::v1 as pb;
use countersign_testkit::server::TestServer;
use sqlx::Connection;
use tonic::Code;
