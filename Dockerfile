# countersign: every binary in one image; docker-compose.yml picks one per service.
#   docker build -t countersign .
# protoc comes from a crate and SQLite is compiled in, so the build needs nothing but Rust.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
        -p countersign-server -p countersign-telegram -p countersign-github -p countersign-cli \
        -p countersign-webhook -p countersign-ntfy \
 && mkdir /out \
 && cp target/release/countersign-server target/release/countersign-telegram \
       target/release/countersign-github target/release/countersign \
       target/release/countersign-webhook target/release/countersign-ntfy /out/

FROM debian:bookworm-slim
# CA roots for the Telegram and GitHub APIs; a system user owning the database volume.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/countersign --create-home countersign
COPY --from=build /out/ /usr/local/bin/
USER countersign
WORKDIR /var/lib/countersign
VOLUME ["/var/lib/countersign"]
# gRPC, Prometheus metrics, GitHub webhooks, webhook and ntfy decision links.
EXPOSE 50051 9090 8080 8787 8788
CMD ["countersign-server", "--help"]
