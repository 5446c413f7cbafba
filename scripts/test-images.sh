#!/usr/bin/env bash
# The real test images: a Debian minbase tree made by debootstrap, and a second one with a
# few packages changed and added (the same mirror apt uses). Output in target/images/:
#   minbase/        the tree (root-owned; devices kept)
#   minbase.tar     a tarball of it (numeric owners)
#   minbase2/ minbase2.tar   the second image
#   changed-bytes   bytes of regular files that differ or are new in minbase2 (truly changed)
# Cached: a second run does nothing. Needs root (debootstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/images
MIRROR=${MIRROR:-$(awk '/^URIs:/ { print $2; exit } /^deb / { print $2; exit }' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
[[ $EUID -eq 0 ]] || { echo "test-images.sh: run as root" >&2; exit 1; }
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
mkdir -p "$OUT"
if [[ ! -s $OUT/minbase.tar ]]; then
  rm -rf "$OUT/minbase" "$OUT/minbase.tmp"
  echo "test-images: debootstrap --variant=minbase $SUITE from $MIRROR" >&2
  debootstrap --variant=minbase "$SUITE" "$OUT/minbase.tmp" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 \
    || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
  rm -rf "$OUT/minbase.tmp/var/cache/apt/archives/"*.deb
  mv "$OUT/minbase.tmp" "$OUT/minbase"
  tar --numeric-owner -C "$OUT/minbase" -cf "$OUT/minbase.tar.tmp" .
  mv "$OUT/minbase.tar.tmp" "$OUT/minbase.tar"
fi
if [[ ! -s $OUT/minbase2.tar ]]; then
  rm -rf "$OUT/minbase2"
  cp -a "$OUT/minbase" "$OUT/minbase2"
  # Changed: a few packages added; their files and the dpkg/apt state they touch.
  mount --bind /proc "$OUT/minbase2/proc"
  trap 'umount "$OUT/minbase2/proc" 2>/dev/null || true' EXIT
  chroot "$OUT/minbase2" apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive chroot "$OUT/minbase2" apt-get install -y -qq --no-install-recommends \
    less netbase iproute2 >"$OUT/minbase2.log" 2>&1 || { tail -20 "$OUT/minbase2.log" >&2; exit 1; }
  chroot "$OUT/minbase2" apt-get clean
  rm -rf "$OUT/minbase2/var/lib/apt/lists/"*
  umount "$OUT/minbase2/proc"; trap - EXIT
  tar --numeric-owner -C "$OUT/minbase2" -cf "$OUT/minbase2.tar.tmp" .
  mv "$OUT/minbase2.tar.tmp" "$OUT/minbase2.tar"
fi
if [[ ! -s $OUT/changed-bytes ]]; then
  # Regular files in minbase2 whose bytes are not the bytes of the same path in minbase.
  (cd "$OUT/minbase2" && find . -xdev -type f -print0) | while IFS= read -r -d '' f; do
    if ! cmp -s "$OUT/minbase2/$f" "$OUT/minbase/$f" 2>/dev/null; then stat -c %s "$OUT/minbase2/$f"; fi
  done | awk '{ s += $1 } END { print s + 0 }' >"$OUT/changed-bytes"
fi
echo "test-images: $(du -sh "$OUT/minbase" | cut -f1) minbase, $(du -sh "$OUT/minbase2" | cut -f1) minbase2, changed bytes $(cat "$OUT/changed-bytes")" >&2
