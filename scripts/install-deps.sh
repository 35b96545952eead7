#!/usr/bin/env bash
# Installs what building and testing Mosaic needs, only when it is missing: a C/C++ toolchain and
# libclang (for RocksDB's bindings), openssl (test certificates) and iproute2 (the partition test's network
# namespaces) from apt, and the Rust toolchain's rustfmt and clippy.
set -euo pipefail
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

need_apt=()
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# The HTTPS tests make their certificates with it (scripts/test-cert.sh).
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The partition test puts nodes in network namespaces of its own (`ip netns`, veth pairs, bridges; as root).
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)

apt_install "${need_apt[@]}"

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo is missing; install Rust 1.95 (rustup) and run this again" >&2
    exit 1
fi
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
