#!/usr/bin/env bash
# Images: Paddock's tar ingest versus `tar -x` + `sha512sum` over the same tarball, and how
# much of a second, slightly changed image is new, in one run.
#   paddock   paddock-ingest-bench: the tarball streamed into a fresh object store (every
#             regular file hashed with SHA-512 and stored once by hash), then syncfs;
#   peer      tar -x into a fresh directory, sha512sum over every file, then sync.
# Both read the same page-cached tarball and write to the same file system; best of RUNS.
# Then minbase2.tar (minbase plus three packages) is ingested into the store that holds
# minbase: its new bytes against the bytes of files that truly differ (scripts/test-images.sh).
# Prints
#   images ingest paddock=<MB/s> tar+sha512sum=<MB/s>
#   images ingest ratio paddock/tar+sha512sum=<R>
#   images dedup new_bytes=<n> changed_bytes=<m> ratio=<n/m>
# Run as root (it builds what it needs):  bash bench/images.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
RUNS=${RUNS:-3}
[[ $EUID -eq 0 ]] || { echo "run as root (debootstrap for the test images)" >&2; exit 1; }
BIN=target/release/paddock-ingest-bench
scripts/install-deps.sh --bench >&2
cargo build --release --locked -q -p paddock-imageserver --bin paddock-ingest-bench
[[ -s target/images/minbase2.tar ]] || bash scripts/test-images.sh
TAR=target/images/minbase.tar
WORK=$(mktemp -d target/bench-images.XXXXXX)
images_cleanup() { rm -rf "$WORK"; }
bench_guard images images_cleanup
cat "$TAR" target/images/minbase2.tar >/dev/null # page cache
best_p= best_t=
for i in $(seq "$RUNS"); do
  rm -rf "$WORK/store"; sync
  p=$($BIN "$WORK/store" "$TAR" | sed -E 's/.*seconds=([0-9.]+).*/\1/')
  rm -rf "$WORK/tree"; mkdir "$WORK/tree"; sync
  t0=$(date +%s.%N)
  tar -xf "$TAR" -C "$WORK/tree"
  find "$WORK/tree" -type f -print0 | xargs -0 -r sha512sum >/dev/null
  sync
  t1=$(date +%s.%N)
  t=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  echo "# run $i: paddock ${p}s  tar+sha512sum ${t}s" >&2
  best_p=$(awk -v a="${best_p:-1e9}" -v b="$p" 'BEGIN { print (b < a) ? b : a }')
  best_t=$(awk -v a="${best_t:-1e9}" -v b="$t" 'BEGIN { print (b < a) ? b : a }')
done
size=$(stat -c %s "$TAR")
awk -v s="$size" -v p="$best_p" -v t="$best_t" 'BEGIN {
  printf "images ingest paddock=%.1fMB/s tar+sha512sum=%.1fMB/s (%d-byte tarball, best of runs)\n", s / p / 1e6, s / t / 1e6, s
  printf "images ingest ratio paddock/tar+sha512sum=%.2f\n", t / p }'
rm -rf "$WORK/store"
out=$($BIN "$WORK/store" "$TAR" target/images/minbase2.tar)
new=$(tail -1 <<<"$out" | sed -E 's/.*new_bytes=([0-9]+).*/\1/')
changed=$(cat target/images/changed-bytes)
total=$(tail -1 <<<"$out" | sed -E 's/.* bytes=([0-9]+).*/\1/')
echo "# minbase2: $total content bytes, $new new, $changed in files that differ from minbase" >&2
awk -v n="$new" -v m="$changed" 'BEGIN { printf "images dedup new_bytes=%d changed_bytes=%d ratio=%.3f\n", n, m, n / m }'
