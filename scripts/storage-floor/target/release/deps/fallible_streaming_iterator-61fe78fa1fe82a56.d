/work/main/scripts/storage-floor/target/release/deps/fallible_streaming_iterator-61fe78fa1fe82a56.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-streaming-iterator-0.1.9/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libfallible_streaming_iterator-61fe78fa1fe82a56.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-streaming-iterator-0.1.9/src/lib.rs

/work/main/scripts/storage-floor/target/release/deps/libfallible_streaming_iterator-61fe78fa1fe82a56.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-streaming-iterator-0.1.9/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/fallible-streaming-iterator-0.1.9/src/lib.rs:
