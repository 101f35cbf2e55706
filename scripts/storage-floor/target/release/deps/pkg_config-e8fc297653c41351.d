/work/main/scripts/storage-floor/target/release/deps/pkg_config-e8fc297653c41351.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libpkg_config-e8fc297653c41351.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libpkg_config-e8fc297653c41351.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs:
