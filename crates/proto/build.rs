use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // protoc comes from a crate so that a fresh machine needs no system install.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let include = protoc_bin_vendored::include_path()?;

    // Read at run time, not compiled in: a build script binary shared between checkouts (a
    // hard-linked target directory) must read this checkout's proto files.
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [proto_root.join("countersign/v1/approval.proto")];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptor = PathBuf::from(std::env::var("OUT_DIR")?).join("countersign_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor)
        .compile_protos(&files, &[proto_root, include])?;
    Ok(())
}
