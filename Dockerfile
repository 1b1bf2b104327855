# syntax=docker/dockerfile:1
# kpng's container image (deploy/20-daemonset.yaml runs it):
#   docker build -t kpng:dev .
#
# Built on bookworm and run on bookworm, so the binary links against the same glibc. The runtime
# image has what the nftables backend uses (`nft` and libnftables from `nftables`) plus the
# tools one reaches for on a proxy node (`conntrack`, `ip`).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kpng \
    && install -D -m 0755 target/release/kpng /out/kpng

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables conntrack iproute2 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kpng /usr/local/bin/kpng
ENTRYPOINT ["/usr/local/bin/kpng"]
