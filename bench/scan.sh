#!/usr/bin/env bash
# subd's scanner: throughput in page cache against sha512sum, and the I/O rate limit, in one run.
#   1. Page cache: the Debian minbase tree (target/images/minbase, from
#      scripts/test-images.sh) is read once to warm the cache, then scanned by
#      `paddock-subd-scan DIR` (walk + SHA-512 of every inode on 2 threads + object-cache
#      listing) and hashed by `find DIR -xdev -type f -print0 | xargs -0 sha512sum`
#      (single-threaded), best of 3 wall-clock times each. Each side's MB/s is over the bytes
#      it hashed (sha512sum hashes every name of a hard-linked file; subd each inode once).
#      Goal: ratio subd/sha512sum >= 1.2.
#   2. Rate limit: sync + drop_caches, the device benchmark (O_DIRECT, 128 MiB; the device
#      under DIR, or its largest files where the device cannot be opened), drop_caches again,
#      then a scan limited to IO_PERCENT % of that speed, stopped after MAX_SECONDS.
#      achieved = bytes read from the device by the scan's threads (ru_inblock) / wall time.
#      Goal: within ±15 % of the target. The device's own counter (/sys/dev/block/M:m/stat)
#      is shown as device_all_MB/s, a loose cross-check: it counts every process's reads, and
#      after drop_caches everything running reloads its files.
# Prints
#   scan subd ... MB/s=<X> / scan sha512sum ... MB/s=<Y> / scan ratio subd/sha512sum=<R>
#   scan ratelimit target=<MB/s> achieved=<MB/s>   (and a detail line)
# Run as root (it builds what it needs):  bash bench/scan.sh
# Env: DIR=target/images/minbase IO_PERCENT=2 MAX_SECONDS=60 RUNS=3
#      DEVICE_SPEED=<bytes/s> (skip the device benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_guard scan
DIR=${DIR:-target/images/minbase}
IO_PERCENT=${IO_PERCENT:-2}
MAX_SECONDS=${MAX_SECONDS:-60}
RUNS=${RUNS:-3}
[[ $EUID -eq 0 ]] || { echo "run as root (drop_caches, the block device)" >&2; exit 1; }
BIN=target/release/paddock-subd-scan
scripts/install-deps.sh --bench >&2
cargo build --release --locked -q -p paddock-subd --bin paddock-subd-scan
if [[ ! -d $DIR ]]; then
    [[ $DIR == target/images/minbase ]] || { echo "no tree at $DIR" >&2; exit 1; }
    echo "# building the minbase tree: scripts/test-images.sh" >&2
    bash scripts/test-images.sh
fi
now() { echo "$EPOCHREALTIME"; }
field() { sed -nE "s#.*(^| )$1=([^ ]+).*#\2#p" <<<"$2"; } # field KEY LINE

# --- 1. in page cache -------------------------------------------------------------------
echo "# warming the page cache with $DIR" >&2
find "$DIR" -xdev -type f -print0 | xargs -0 cat >/dev/null
"$BIN" "$DIR" >/dev/null
sha_files=$(find "$DIR" -xdev -type f | wc -l)
sha_bytes=$(find "$DIR" -xdev -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d", s }')

best_subd= best_sha= out=
for ((i = 0; i < RUNS; i++)); do
    t0=$(now); out=$("$BIN" "$DIR"); t1=$(now)
    t=$(calc "$t1 - $t0")
    [[ -z $best_subd ]] || (($(calc "$t < $best_subd"))) && best_subd=$t
    [[ $(field complete "$out") == true ]] || { echo "incomplete scan: $out" >&2; exit 1; }
    t0=$(now); find "$DIR" -xdev -type f -print0 | xargs -0 sha512sum >/dev/null; t1=$(now)
    t=$(calc "$t1 - $t0")
    [[ -z $best_sha ]] || (($(calc "$t < $best_sha"))) && best_sha=$t
done
subd_files=$(field files "$out")
subd_bytes=$(field bytes "$out")
subd_mbs=$(calc "sprintf(\"%.1f\", $subd_bytes / 1e6 / $best_subd)")
sha_mbs=$(calc "sprintf(\"%.1f\", $sha_bytes / 1e6 / $best_sha)")
echo "scan subd files=$subd_files bytes=$subd_bytes seconds=$(calc "sprintf(\"%.3f\", $best_subd)") MB/s=$subd_mbs (inodes, 2 threads, best of $RUNS)"
echo "scan sha512sum files=$sha_files bytes=$sha_bytes seconds=$(calc "sprintf(\"%.3f\", $best_sha)") MB/s=$sha_mbs (names, best of $RUNS)"
echo "scan ratio subd/sha512sum=$(calc "sprintf(\"%.2f\", $subd_mbs / $sha_mbs)")"

# --- 2. rate-limited, from the device ---------------------------------------------------
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
drop_caches
if [[ -n ${DEVICE_SPEED:-} ]]; then
    speed=$DEVICE_SPEED
    echo "# device speed from DEVICE_SPEED: $speed bytes/s" >&2
else
    bench=$("$BIN" --measure-device "$DIR")
    echo "# $bench" >&2
    speed=$(field bytes_per_s "$bench")
fi
drop_caches
dev=$(stat -c '%d' "$DIR")
devstat=/sys/dev/block/$((dev >> 8 & 0xfff)):$(((dev & 0xff) | (dev >> 12 & 0xfff00)))/stat
sectors() { if [[ -r $devstat ]]; then awk '{ print $3 }' "$devstat"; else echo 0; fi; }
s0=$(sectors)
out=$("$BIN" --io-percent "$IO_PERCENT" --device-speed "$speed" --max-seconds "$MAX_SECONDS" "$DIR")
s1=$(sectors)
target=$(field target_MB/s "$out")
achieved=$(field media_MB/s "$out")
secs=$(field seconds "$out")
echo "scan ratelimit target=$target achieved=$achieved"
echo "scan ratelimit io_percent=$IO_PERCENT device_MB/s=$(calc "sprintf(\"%.1f\", $speed / 1e6)") media_bytes=$(field media_bytes "$out") seconds=$secs complete=$(field complete "$out") deviation=$(calc "sprintf(\"%+.1f%%\", ($achieved / $target - 1) * 100)") device_all_MB/s=$(calc "sprintf(\"%.2f\", ($s1 - $s0) * 512 / 1e6 / $secs)")"
