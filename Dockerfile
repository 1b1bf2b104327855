# syntax=docker/dockerfile:1
# kpng's container image (deploy/20-daemonset.yaml runs it; so can a kubeadm kube-proxy
# DaemonSet, see docs/deploy.md):
#   docker build -t kpng:dev .
#
# The binary is built with the `dist` profile (release, debug info stripped, symbols kept;
# Cargo.toml). The image is `scratch` plus what scripts/image-rootfs.sh copies from the build
# stage: kpng (also as /usr/local/bin/kube-proxy), nft and libnftables, iptables (nft and
# legacy variants) with its extensions, ip, and the libraries they link. No shell, no package
# manager. Built on bookworm, so the libraries are bookworm's (glibc, nftables 1.0.6,
# iptables 1.8.9).

FROM rust:1.95-bookworm AS build
# clang and libbpf-dev build the eBPF backend's programs (crates/backend-ebpf/build.rs).
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables iptables iproute2 ca-certificates netbase \
       clang libbpf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p kpng \
    && install -D -m 0755 target/dist/kpng /out/kpng
RUN scripts/image-rootfs.sh /out/kpng /rootfs

FROM scratch
COPY --from=build /rootfs/ /
ENTRYPOINT ["/usr/local/bin/kpng"]
