#!/usr/bin/env bash
# The real test images: a Debian minbase tree made by debootstrap, and a second one with a
# few packages changed and added (from the mirror apt uses; none is assumed). Output in target/images/:
#   minbase/        the tree (root-owned; devices kept)
#   minbase.tar     a tarball of it (numeric owners)
#   minbase2/ minbase2.tar   the second image
#   changed-bytes   bytes of regular files that differ or are new in minbase2 (truly changed)
# Cached: a second run does nothing; the debootstrap root is cached in $PADDOCK_CACHE
# (default /var/cache/paddock) so fresh clones reuse it. Needs root (debootstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${IMAGES_OUT:-target/images}
[[ $EUID -eq 0 ]] || { echo "test-images.sh: run as root" >&2; exit 1; }
source scripts/debian.sh
mkdir -p "$OUT"
if [[ ! -s $OUT/minbase.tar ]]; then
  # The pristine minbase root (debootstrap from the mirror apt uses, cached across clones).
  base=$(minbase_tarball) || { echo "test-images.sh: no minbase root" >&2; exit 1; }
  rm -rf "$OUT/minbase" "$OUT/minbase.tmp"
  mkdir "$OUT/minbase.tmp"
  tar --numeric-owner -C "$OUT/minbase.tmp" -xpf "$base"
  mv "$OUT/minbase.tmp" "$OUT/minbase"
  cp "$base" "$OUT/minbase.tar.tmp"
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
