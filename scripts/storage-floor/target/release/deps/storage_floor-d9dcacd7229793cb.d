/work/main/scripts/storage-floor/target/release/deps/storage_floor-d9dcacd7229793cb.d: src/main.rs

/work/main/scripts/storage-floor/target/release/deps/storage_floor-d9dcacd7229793cb: src/main.rs

src/main.rs:

# env-dep:CARGO_MANIFEST_DIR=/work/main/scripts/storage-floor
