#!/usr/bin/env bash
# subd's Update change window for the Debian minbase → minbase2 transition (the issue's
# acceptance figure: under 1 s). Runs the integration test subd/tests/minbase.rs, which copies
# target/images/minbase to a temporary root, lets an in-process subd scan it, fetch the
# missing objects from an object server and apply the update over HTTP, then checks the
# tree against minbase2 byte for byte. The change window is the applier's steps 3-7
# (directories, inodes, hard links, deletions, metadata), timed inside subd.
# Prints `update change window: <ms> ms (...)` once per run (best and all runs at the end).
# Run as root: bash bench/update.sh          Env: RUNS=3 PROFILE=release|dev
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_guard update
RUNS=${RUNS:-3}
PROFILE=${PROFILE:-release}
[[ $EUID -eq 0 ]] || { echo "run as root (the trees are root-owned)" >&2; exit 1; }
[[ -d target/images/minbase2 ]] || bash scripts/test-images.sh
flag=(); [[ $PROFILE == release ]] && flag=(--release)
cargo test "${flag[@]}" -p paddock-subd --test minbase --no-run >&2
all=()
for ((i = 0; i < RUNS; i++)); do
    line=$(cargo test "${flag[@]}" -q -p paddock-subd --test minbase -- --nocapture 2>/dev/null \
        | grep '^update change window:')
    echo "$line"
    all+=("$(sed -E 's/^update change window: ([0-9.]+) ms.*/\1/' <<<"$line")")
done
printf '%s\n' "${all[@]}" | sort -n | head -1 | xargs -I{} echo "update change window best={} ms runs=${all[*]} profile=$PROFILE"
