#!/usr/bin/env bash
# Builds the discovery ramdisk into target/ramdisk (vmlinuz, initrd.img): the static agent
# (glibc, +crt-static, explicit --target as static linking needs), then the reproducible
# initramfs with the kernel and modules of Debian's linux-image-amd64 (downloaded into
# target/ramdisk-cache, never installed over the host's kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
  cargo build --release --locked -p paddock-ramdisk --bin paddock-agent --target x86_64-unknown-linux-gnu
cargo build --release --locked -p paddock-ramdisk --bin paddock-ramdisk-build
target/release/paddock-ramdisk-build \
  --agent target/x86_64-unknown-linux-gnu/release/paddock-agent \
  --out target/ramdisk --cache target/ramdisk-cache
