#!/usr/bin/env bash
# Builds the discovery ramdisk into target/ramdisk (vmlinuz, initrd.img): the static agent
# and the static paddock-subd and fs2objectcache of birth and rebirth (glibc, +crt-static,
# explicit --target as static linking needs; the agent mounts devtmpfs before it starts subd,
# so getrandom finds /dev/urandom), then the reproducible initramfs with the kernel and modules
# of Debian's linux-image-amd64 (downloaded into target/ramdisk-cache, never installed over the
# host's kernel) and the host's sfdisk, wipefs, blkid, blkdiscard, mkfs.ext4 and mkfs.fat with
# their shared libraries. Beside them, Debian's x64 UEFI iPXE (ipxe.efi): UEFI HTTP boot
# fetches its first loader from the same assets directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
STATIC=target/x86_64-unknown-linux-gnu/release
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
  cargo build --release --locked --target x86_64-unknown-linux-gnu \
  -p paddock-ramdisk --bin paddock-agent -p paddock-subd --bin paddock-subd --bin fs2objectcache
cargo build --release --locked -p paddock-ramdisk --bin paddock-ramdisk-build
before=$(stat -c %s target/ramdisk/initrd.img 2>/dev/null || echo 0)
target/release/paddock-ramdisk-build \
  --agent "$STATIC/paddock-agent" \
  --program "$STATIC/paddock-subd" --program "$STATIC/fs2objectcache" \
  --out target/ramdisk --cache target/ramdisk-cache
install -m 0644 /usr/lib/ipxe/ipxe.efi target/ramdisk/ipxe.efi
after=$(stat -c %s target/ramdisk/initrd.img)
echo "build-ramdisk: initrd.img $after bytes (was $before); agent $(stat -c %s "$STATIC/paddock-agent"), paddock-subd $(stat -c %s "$STATIC/paddock-subd"), fs2objectcache $(stat -c %s "$STATIC/fs2objectcache") bytes"
