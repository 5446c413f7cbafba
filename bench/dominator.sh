#!/usr/bin/env bash
# The dominator at fleet scale: the real Herd with HttpSubRpc keeps 10,000
# simulated subs on the Debian minbase image, over HTTP on loopback. No peer: Dominator
# itself is not packaged, so there is nothing to run beside it; the goals are absolute.
#   1. The minbase tree (target/images/minbase, from scripts/test-images.sh) is scanned once
#      with subd's scanner (`paddock-dominator-bench scan`).
#   2. In a network namespace this script creates (lo only; the whole 127.0.0.0/8 is
#      local), `paddock-dominator-bench sim` serves SUBS subs, sub i at 127.1.0.1+i port
#      6969, one axum listener on 0.0.0.0:6969 picking the sub by the connection's local
#      address; each holds the minbase tree and answers Subd.Poll as subd does (the tree
#      only when the caller's generation differs; subd's binary answer, 0.7 MB, to a caller
#      that asks for it as the herd does, else 1.6 MB of JSON).
#   3. `paddock-dominator-bench herd` runs the Herd in the same namespace (image = the same
#      tree, a full image, so every sub plans empty) and measures:
#        first sync       every sub's tree travels once and is planned, BATCH subs added at
#                         a time (detail line; the synced subs' short polls, every
#                         POLL_INTERVAL_MS, compete with it)
#        rss_per_sub_kib  (VmRSS with SUBS synced subs − VmRSS before the herd) / SUBS: the
#                         subs' state, a keep-alive connection each (hyper's 8 KiB read and
#                         write buffers) and what the heap kept of the trees planned
#        short_poll_cycle_s  with CHURN_PERMILLE ‰ of the subs' generations bumped per
#                         second, the time until every sub was polled once (the simulator's
#                         per-sub poll counters), mean of CYCLES cycles
#        full_polls_per_s generations moved BATCH subs at a time until FULL_POLLS trees
#                         travelled: full polls (trees sent) / the time until every sub is
#                         synced again (each poll's tree decoded and planned)
#   `paddock-dominator-bench profile TREE.json` shows where a full poll's CPU goes.
#   The subs speak mutual TLS as an installation's do (a certificate each with its address,
#   the dominator's granting Subd.*: `paddock-dominator-bench certs`), then plain HTTP for
#   comparison (TLS="on off"); with IDLE_POLL_MS (30 s), one more TLS run polls that seldom
#   and counts the connections (each a handshake) made per short-poll cycle: kept-alive
#   connections make none.
#   4. With COMPUTED=1, one more TLS run at the last size where every sub has two computed
#      files (`/etc/motd`, the same everywhere; `/etc/paddock/node.conf`, its own): the herd
#      renders them with the appliance's templates, writes their objects, and lays them over
#      the image per plan; the simulator's subs hold them. render_s is a change of a
#      variable every file uses: every file rendered again, 10,001 new objects written.
#      Prints `dominator computed subs=<N> files=<F> render_s=<s> short_poll_cycle_s=<s>
#      full_polls_per_s=<n> rss_per_sub_kib=<k>` (and no plain `dominator subs=` line: its
#      full polls each lay files over a tree); goals render <= 5 s, cycle <= 10 s, <= 64 KiB
#      per sub.
# Prints, per TLS mode and size in SIZES (the last size is the headline):
#   dominator subs=<N> tls=on|off poll_interval_ms=<ms> short_poll_cycle_s=<s>
#   full_polls_per_s=<n> rss_per_sub_kib=<k> connections_per_cycle=<c>
# and '#' detail lines on stderr (where the time goes: polls/s, connections, mean poll
# latency, CPU µs per poll in the herd and in the simulator).
# Goals (2 cores): cycle <= 10 s, full polls >= 200/s, <= 64 KiB per synced sub.
# Measured with TLS (figures: bench/RESULTS.md): cycle 0.59 s, 488 full polls/s, 57 KiB per
# sub, no connection made per cycle at a 30 s poll interval.
# Measured (2 cores, the simulator on the same cores, SIZES=10000):
#   before (JSON answers, ureq in spawn_blocking, a connection per poll, plans queued
#   behind polls): cycle 58.4 s, 15 full polls/s, 175 KiB per sub.
#   now (binary Poll answers, a keep-alive connection per sub, tree slots, plans at once,
#   the unchanged-sub walk): cycle 1.01 s, 418 full polls/s, 48.2 KiB per sub on a quiet
#   machine (load 0.1 before the run, 3.1 after, the bench's own); 1.39–2.36 s, 202–237/s,
#   47 KiB with other work on the cores (load 6–8, or a QEMU VM taking one core). At 1,000
#   subs: 0.16 s, 586/s, 103 KiB (the heap's share of the trees planned, over fewer subs).
#   A full poll in the herd (profile): 1.4–2.1 ms to decode, 0.3 ms to prove the sub
#   unchanged (the planner, for a drifted sub: 16–21 ms), 0.3 ms to free the tree.
# Run as root (network namespace, the root-owned tree):  bash bench/dominator.sh
# Env: SIZES=10000 (e.g. "1000 10000") POLL_INTERVAL_MS=100 POLL_SLOTS=200 CHURN_PERMILLE=10
#      CYCLES=3 BATCH=500 FULL_POLLS=2000 TLS="on off" IDLE_POLL_MS=30000 (0: no idle run)
#      COMPUTED=1 (0: no computed-files run)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZES=${SIZES:-10000}
POLL_INTERVAL_MS=${POLL_INTERVAL_MS:-100}
POLL_SLOTS=${POLL_SLOTS:-200}
CHURN_PERMILLE=${CHURN_PERMILLE:-10}
CYCLES=${CYCLES:-3}
BATCH=${BATCH:-500}
FULL_POLLS=${FULL_POLLS:-2000}
TLS=${TLS:-on off}
IDLE_POLL_MS=${IDLE_POLL_MS:-30000}
COMPUTED=${COMPUTED:-1}
NS=pdk-bench-dom
DIR=target/images/minbase
BIN=$ROOT/target/release/paddock-dominator-bench
[[ $EUID -eq 0 ]] || { echo "run as root (network namespace, the root-owned tree)" >&2; exit 1; }
source bench/lib.sh

lone_ns_trap "$NS"

cargo build --release --locked -q -p paddock-dominator --features bench --bin paddock-dominator-bench
if [[ ! -d $DIR/etc ]]; then
    log "building the minbase tree: scripts/test-images.sh"
    bash scripts/test-images.sh >&2
fi
lone_ns_up dominator
"$BIN" scan "$DIR" "$SCRATCH/tree.json"

# A keep-alive connection per sub on each side (SUBS descriptors each), and fresh ones when a
# connection is dropped: raise the descriptor limit as far as allowed (at most 65536), and
# widen the ports in the namespace.
hard=$(ulimit -Hn)
[[ $hard == unlimited || $hard -gt 65536 ]] && hard=65536
ulimit -n "$hard"
ip netns exec "$NS" sysctl -qw net.ipv4.ip_local_port_range="1024 65535" \
    net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096

"$BIN" certs "$SCRATCH/tls"

# run SUBS TLS POLL_INTERVAL_MS CYCLES FULL_POLLS [ARGS…]: one simulator and one herd run
# (ARGS to both).
run() {
    local subs=$1 tls=() interval=$3 cycles=$4 full=$5
    local more=("${@:6}")
    [[ $2 == on ]] && tls=(--tls "$SCRATCH/tls")
    ip netns exec "$NS" "$BIN" sim "$SCRATCH/tree.json" --subs "$subs" "${tls[@]}" "${more[@]}" \
        >"$SCRATCH/sim-$subs.log" 2>&1 &
    BG_PID=$!
    for ((i = 0; i < 600; i++)); do
        kill -0 "$BG_PID" 2>/dev/null || { cat "$SCRATCH/sim-$subs.log" >&2; exit 1; }
        ip netns exec "$NS" ss -Hltn "sport = :6969" | grep -q . && break
        sleep 0.1
    done
    cat "$SCRATCH/sim-$subs.log" >&2
    ip netns exec "$NS" "$BIN" herd "$SCRATCH/tree.json" --subs "$subs" "${tls[@]}" \
        --poll-interval-ms "$interval" --poll-slots "$POLL_SLOTS" \
        --churn-permille "$CHURN_PERMILLE" --cycles "$cycles" \
        --batch "$BATCH" --full-polls "$full" "${more[@]}"
    kill "$BG_PID"
    wait "$BG_PID" 2>/dev/null || true
    BG_PID=
}

for tls in $TLS; do
    for subs in $SIZES; do
        run "$subs" "$tls" "$POLL_INTERVAL_MS" "$CYCLES" "$FULL_POLLS"
    done
done
if ((COMPUTED > 0)); then
    # Every sub with two computed files, TLS on: the herd renders them (and stores their
    # objects in $SCRATCH/objects) and lays them over the image per sub.
    run "${SIZES##* }" on "$POLL_INTERVAL_MS" "$CYCLES" "$BATCH" --computed "$SCRATCH/objects"
fi
if ((IDLE_POLL_MS > 0)); then
    # Polls further apart than the listener's header timeout: the connections must stay.
    run "${SIZES##* }" on "$IDLE_POLL_MS" 2 "$BATCH"
fi
