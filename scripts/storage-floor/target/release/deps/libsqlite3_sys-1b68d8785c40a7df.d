/work/main/scripts/storage-floor/target/release/deps/libsqlite3_sys-1b68d8785c40a7df.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/error.rs /work/main/scripts/storage-floor/target/release/build/libsqlite3-sys-6302327fc9e0e4ef/out/bindgen.rs

/work/main/scripts/storage-floor/target/release/deps/liblibsqlite3_sys-1b68d8785c40a7df.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/error.rs /work/main/scripts/storage-floor/target/release/build/libsqlite3-sys-6302327fc9e0e4ef/out/bindgen.rs

/work/main/scripts/storage-floor/target/release/deps/liblibsqlite3_sys-1b68d8785c40a7df.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/error.rs /work/main/scripts/storage-floor/target/release/build/libsqlite3-sys-6302327fc9e0e4ef/out/bindgen.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/lib.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libsqlite3-sys-0.30.1/src/error.rs:
/work/main/scripts/storage-floor/target/release/build/libsqlite3-sys-6302327fc9e0e4ef/out/bindgen.rs:

# env-dep:OUT_DIR=/work/main/scripts/storage-floor/target/release/build/libsqlite3-sys-6302327fc9e0e4ef/out
