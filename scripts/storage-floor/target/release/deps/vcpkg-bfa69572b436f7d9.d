/work/main/scripts/storage-floor/target/release/deps/vcpkg-bfa69572b436f7d9.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/vcpkg-0.2.15/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libvcpkg-bfa69572b436f7d9.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/vcpkg-0.2.15/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libvcpkg-bfa69572b436f7d9.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/vcpkg-0.2.15/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/vcpkg-0.2.15/src/lib.rs:
