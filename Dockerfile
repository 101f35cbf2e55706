# countersign: every binary in one image (the all-in-one `countersign`, the server, the
# Telegram, GitHub, Slack, ntfy and webhook workers, the web inbox); docker-compose.yml picks
# one per service.
#   docker build --build-arg COUNTERSIGN_BUILD_COMMIT="$(git rev-parse --short=12 HEAD)" -t countersign .
# The binaries are built by scripts/release-build, as the release archives are (the dist
# profile, docs/install.md): the same script, the same archive, the same files.
# protoc comes from a crate and SQLite is compiled in, so the build needs nothing but Rust.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# .git stays out of the build context: `countersign --version` names the commit given here.
ARG COUNTERSIGN_BUILD_COMMIT=unknown
RUN COUNTERSIGN_BUILD_COMMIT="$COUNTERSIGN_BUILD_COMMIT" \
    scripts/release-build --profile dist --out /dist > /dist-archive \
 && mkdir /out \
 && tar -C /out --strip-components=1 -xzf "$(cat /dist-archive)" \
 && rm /out/README.md

FROM debian:bookworm-slim
# CA roots for the Telegram, GitHub and Slack APIs; a system user owning the database volume.
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
# The server's gRPC health service (open without a token). The workers' services in
# docker-compose.yml turn it off: they serve no gRPC.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["countersign-server", "healthcheck", "--url", "http://127.0.0.1:50051", "--timeout-ms", "3000"]
# The server with its config file mounted at /etc/countersign/countersign.toml (which must
# configure tokens: it listens on all interfaces).
CMD ["countersign-server", "--config", "/etc/countersign/countersign.toml", \
     "--listen", "0.0.0.0:50051", "--database", "/var/lib/countersign/countersign.db"]
