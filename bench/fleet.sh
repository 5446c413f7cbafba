#!/usr/bin/env bash
# A rack refresh: SUBS real paddock-subd processes, each on its own empty root (tmpfs) and
# its own loopback address in the lab's namespace, told at once to run the same new image;
# against nginx serving the image's tarball to as many `curl | tar -x` clients, in the same
# run (vm-tests/src/bin/paddock-fleet-bench.rs says exactly what each clock covers).
#   paddock  TLS as operators run it (every subd with its own certificate), max_updates =
#            SUBS, no fetch pacing; the clock runs from the new MDB file to the dominator
#            marking the last sub synced (fetched, verified, applied, proved by a scan), as
#            its census's since_ms says.
#   nginx    plain HTTP, `curl | tar -x` into empty roots on the same file system.
# Prints, per fleet size:
#   fleet subs=<N> tls=on paddock_s=<s> nginx_s=<s> ratio=<r>      (goal at 50: <= 1.3)
#   fleet subs=<N> refetched=0         (no sub fetched an object twice; the bench fails if one did)
# Run as root (network namespace, /dev/shm):  bash bench/fleet.sh
# Env: SUBS="50 200"
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_guard fleet
[[ $EUID -eq 0 ]] || { echo "run as root" >&2; exit 1; }
scripts/install-deps.sh --bench
cargo build --release --locked -q -p paddock -p paddock-subd -p paddock-vm-tests
scripts/test-images.sh >/dev/null
for n in ${SUBS:-50 200}; do
  PADDOCK_BIN=target/release/paddock target/release/paddock-fleet-bench --subs "$n"
done
