#!/usr/bin/env bash
# Builds the discovery ramdisk into target/ramdisk (vmlinuz, initrd.img): the static agent
# and the static paddock-subd and fs2objectcache of birth and rebirth (glibc, +crt-static,
# explicit --target as static linking needs; the agent mounts devtmpfs before it starts subd,
# so getrandom finds /dev/urandom), then the reproducible initramfs with the kernel and modules
# of Debian's linux-image-amd64 (downloaded into target/ramdisk-cache, never installed over the
# host's kernel) and the host's sfdisk, wipefs, blkid, blkdiscard, mkfs.ext4 and mkfs.fat with
# their shared libraries. Beside them, Debian's x64 UEFI iPXE (ipxe.efi): UEFI HTTP boot
# fetches its first loader from the same assets directory.
#
# --arch aarch64 builds the arm64 inspection ramdisk into target/ramdisk/aarch64 instead:
# the agent cross-compiled (Rust's aarch64 standard library, Debian's aarch64 cross gcc),
# Debian's arm64 kernel and static busybox, and Debian's signed arm64 network GRUB
# (grubaa64.efi), the loader arm64 machines are given. The arm64 packages are downloaded
# with an apt state of their own under target/ramdisk-cache (the host's dpkg never sees an
# arm64 package). No host tools go in: the host's are x86-64, so this ramdisk inspects but
# does not install.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=x86_64
while (( $# )); do
  case "$1" in
    --arch) arch="${2:-}"; shift 2 ;;
    --arch=*) arch="${1#--arch=}"; shift ;;
    *) echo "build-ramdisk: unknown argument $1 (usage: build-ramdisk.sh [--arch x86_64|aarch64])" >&2; exit 2 ;;
  esac
done
scripts/install-deps.sh
# Everything here is built static for x86-64, the ramdisk's builder (a host tool) included:
# built with the agent, it shares the agent's compiled dependencies instead of compiling
# them a second time for the host's default target (cold: 240 s became 125 s).
# Both architectures ask for the same set, so that the second build finds it done (a smaller
# set resolves the dependencies' features differently and compiles them again).
STATIC=target/x86_64-unknown-linux-gnu/static
static_build() {
  RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
    cargo build --profile static --locked --target x86_64-unknown-linux-gnu \
    -p paddock-ramdisk --bin paddock-agent --bin paddock-ramdisk-build \
    -p paddock-subd --bin paddock-subd --bin fs2objectcache
}
BUILDER=$STATIC/paddock-ramdisk-build

if [[ "$arch" == aarch64 ]]; then
  target=aarch64-unknown-linux-gnu
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
  RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
    cargo build --profile static --locked --target "$target" -p paddock-ramdisk --bin paddock-agent
  static_build
  cache=target/ramdisk-cache/arm64
  mkdir -p "$cache/lists/partial" "$cache/archives/partial"
  apt_arm64=(-o "Dir::State::Lists=$cache/lists" -o "Dir::Cache=$cache" -o "Dir::Cache::archives=$cache/archives"
    -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Dir::State::status=/dev/null
    -o APT::Sandbox::User=root)
  apt-get "${apt_arm64[@]}" update -qq
  kernel=$(apt-cache "${apt_arm64[@]}" depends linux-image-arm64 | awk '/Depends: linux-image-/ {print $2; exit}')
  [[ -n "$kernel" ]] || { echo "build-ramdisk: apt names no arm64 kernel behind linux-image-arm64" >&2; exit 1; }
  # Each package is extracted once into a tree of its own (skipped when complete).
  extract() {
    local pkg=$1 tree="$cache/$1"
    [[ -f "$tree/.paddock-extracted" ]] && return
    (cd "$cache" && apt-get "${apt_arm64[@]}" download "$pkg" >/dev/null)
    local deb
    deb=$(ls -t "$cache/${pkg}_"*_arm64.deb | head -1)
    rm -rf "$tree" && dpkg-deb -x "$deb" "$tree" && echo "$deb" > "$tree/.paddock-extracted"
  }
  extract "$kernel"; extract busybox-static; extract grub-efi-arm64-signed
  out=target/ramdisk/aarch64
  "$BUILDER" \
    --agent "target/$target/static/paddock-agent" --busybox "$cache/busybox-static/bin/busybox" \
    --kernel-tree "$cache/$kernel" --no-tools --out "$out" --cache "$cache"
  install -m 0644 "$cache/grub-efi-arm64-signed/usr/lib/grub/arm64-efi-signed/grubnetaa64.efi.signed" "$out/grubaa64.efi"
  echo "build-ramdisk: aarch64 initrd.img $(stat -c %s "$out/initrd.img") bytes; agent $(stat -c %s "target/$target/static/paddock-agent") bytes; grubaa64.efi"
  exit 0
fi
[[ "$arch" == x86_64 ]] || { echo "build-ramdisk: --arch is x86_64 or aarch64, not $arch" >&2; exit 2; }

static_build
before=$(stat -c %s target/ramdisk/initrd.img 2>/dev/null || echo 0)
"$BUILDER" \
  --agent "$STATIC/paddock-agent" \
  --program "$STATIC/paddock-subd" --program "$STATIC/fs2objectcache" \
  --out target/ramdisk --cache target/ramdisk-cache
install -m 0644 /usr/lib/ipxe/ipxe.efi target/ramdisk/ipxe.efi
after=$(stat -c %s target/ramdisk/initrd.img)
echo "build-ramdisk: initrd.img $after bytes (was $before); agent $(stat -c %s "$STATIC/paddock-agent"), paddock-subd $(stat -c %s "$STATIC/paddock-subd"), fs2objectcache $(stat -c %s "$STATIC/fs2objectcache") bytes"
