//! The gRPC contract of countersign, generated from `proto/countersign/v1/*.proto`.

pub mod v1 {
    tonic::include_proto!("countersign.v1");

    /// Encoded file descriptor set, for the gRPC reflection service.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("countersign_descriptor");
}

pub use prost_types::Timestamp;
