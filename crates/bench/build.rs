use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from a crate so that a fresh machine needs no system install.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    // Read at run time, not compiled in: a build script binary shared between checkouts must
    // read this checkout's proto file.
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let file = proto_root.join("echo.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    tonic_prost_build::configure().compile_protos(&[file], &[proto_root])?;
    Ok(())
}
