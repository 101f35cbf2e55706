/work/main/scripts/storage-floor/target/release/storage-floor: /work/main/scripts/storage-floor/src/main.rs
