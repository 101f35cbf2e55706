//! The bench's tests through the real `countersign-bench` binary, one test binary (linked once).

mod deploy;
mod floor;
mod postgres;
mod workspace;
