/work/main/scripts/storage-floor/target/release/deps/fallible_iterator-4e5448a09f624133.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-iterator-0.3.0/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libfallible_iterator-4e5448a09f624133.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-iterator-0.3.0/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libfallible_iterator-4e5448a09f624133.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-iterator-0.3.0/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-iterator-0.3.0/src/lib.rs:
