#!/usr/bin/env bash
# DHCP throughput benchmark: Paddock vs Kea vs dnsmasq over DHCPv4, then Paddock vs Kea's
# DHCPv6 server over DHCPv6 (SERVERS6), in the same run.
#
# What it measures: for each server, the highest rate of complete 4-way
# (DISCOVER-OFFER-REQUEST-ACK) exchanges per second it sustains with < 1 %
# failed exchanges, as driven by ISC's perfdhcp. Every step restarts the server
# with an empty lease database, and every server persists leases to disk:
#   paddock  data_dir in scratch (fsync per batch)
#   kea      kea-dhcp4, memfile, persist=true, lfc-interval=0, dhcp-socket-type=udp,
#            multi-threading left at the package default (off in Kea 2.2, Debian 12)
#   dnsmasq  --dhcp-leasefile in scratch
# Per-lease logging is turned down on all three (Kea WARN, dnsmasq --quiet-dhcp,
# PADDOCK_LOG=warn for Paddock) so the log file is not what gets measured.
#
# Topology: namespace pdk-bench-srv (198.18.0.1/24, veth-srv) <-> pdk-bench-cli
# (198.18.0.2/24, veth-cli). perfdhcp behaves as a relay agent: it binds
# 198.18.0.2:67, sends DISCOVER/REQUEST with giaddr=198.18.0.2 (hops=1, flags=0)
# to 198.18.0.1:67 and expects the replies unicast to giaddr, port 67.
# The subnet is 198.18.0.0/15, pool 198.18.1.0-198.19.255.254 (131070 addresses).
#
# Rate search: RATES are tried in order for DURATION seconds each; the search stops
# at the first rate with >= 1 % failures, then bisects BISECT times between the last
# good and the first bad rate. If even the first rate fails, it halves down to 50/s.
# failures % = (DO drops + RA drops) / DISCOVERs sent; achieved = ACKs / DURATION.
#
# Run (as root):  bash bench/dhcp.sh
# Env knobs:
#   SERVERS="paddock kea dnsmasq"   subset/order of servers to run
#   PADDOCK_BIN=target/release/paddock  (relative to the repo root, or absolute)
#   PADDOCK_LOG=warn  Paddock's log filter (tracing EnvFilter syntax)
#   DURATION=10       seconds per step (perfdhcp -p)
#   CLIENTS=100000    simulated clients (perfdhcp -R; must stay below the pool size)
#   RATES="500 1000 2000 4000 6000 8000 10000 12000 16000 20000 24000 32000 48000"
#   BISECT=2          extra steps bisecting between the last good and first bad rate
#   PIN_CPUS=1        pin every server (all its threads) to CPU 0 and perfdhcp to CPU 1, so the
#                     load generator, which needs a whole core, never takes the server's; each
#                     server gets exactly one core. 0: let the scheduler mix them. Pinned,
#                     perfdhcp runs single-threaded (-g single): its default on a machine of
#                     more than one CPU is a second thread that receives, and two threads on
#                     one core sent at most 24,000-27,000 DHCPv6 exchanges/s here, one 34,000.
#   SERVERS6="paddock kea"          the DHCPv6 run's servers ("" skips it)
#   CLIENTS6=100000   simulated DHCPv6 clients
#   CLIENT_RCVBUF=4194304  net.core.rmem_default while the bench runs (restored at its end;
#                     0 leaves it alone). perfdhcp reads every reply through one socket with
#                     the system's default receive buffer (212,992 bytes on Debian 12, about
#                     160 replies), and a server that answers a batch at once (Paddock sends a
#                     batch's replies when its leases are durable) overflows it although it
#                     answered every request: those are the rig's losses, not the server's.
#                     Every server, Kea included, is measured with the same setting.
#
# DHCPv6: the same search with 4-way SOLICIT-ADVERTISE-REQUEST-REPLY exchanges. perfdhcp -6
# sends from veth-cli's link-local address to ff02::1:2 (no relay); the servers serve
# 2001:2::/64 (veth-srv holds 2001:2::1), pool 2001:2::1:0-2001:2::ffff:ffff, and persist
# every lease: Paddock its store (fsync per batch), Kea kea-dhcp6 memfile, persist=true,
# lfc-interval=0.
# Each step also prints the server's own CPU time (all its threads) and the exchanges it
# completed per second of it (per_cpu_s); the summary's per_cpu_s ratio is taken at each
# server's best passing step. It says what one core of server buys whatever the load
# generator manages (perfdhcp polls, so its own CPU is always busy and says nothing).
# Each step also prints sent (the DISCOVERs or SOLICITs perfdhcp managed per second; below
# 97 % of the rate asked at a server's best step, the summary says generator_bound=yes).
# Each step also prints client_rcvbuf_drops: replies that reached perfdhcp's namespace and
# were dropped there because its socket was full (the namespace's Udp[6]RcvbufErrors).
# Output: per-step lines and a summary on stdout; progress/log notes on stderr.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SERVERS=${SERVERS:-paddock kea dnsmasq}
SERVERS6=${SERVERS6-paddock kea}
CLIENTS6=${CLIENTS6:-100000}
FAMILY=4
export PIN_CPUS=${PIN_CPUS:-1}
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-100000}
RATES=${RATES:-500 1000 2000 4000 6000 8000 10000 12000 16000 20000 24000 32000 48000}
BISECT=${BISECT:-2}
POOL_SIZE=131070

bench_init dhcp
((CLIENTS < POOL_SIZE)) || die "CLIENTS=$CLIENTS must be below the pool size $POOL_SIZE"
for s in $SERVERS; do
    case $s in paddock | kea | dnsmasq) ;; *) die "unknown server '$s' in SERVERS" ;; esac
done
for s in $SERVERS6; do
    case $s in paddock | kea) ;; *) die "unknown server '$s' in SERVERS6" ;; esac
done
[[ " $SERVERS $SERVERS6 " == *" paddock "* ]] && paddock_bin
bench_deps
CLIENT_RCVBUF=${CLIENT_RCVBUF:-4194304}
if ((CLIENT_RCVBUF > 0)); then
    OLD_RMEM=$(sysctl -n net.core.rmem_default)
    bench_restore() { sysctl -qw net.core.rmem_default="$OLD_RMEM"; }
    sysctl -qw net.core.rmem_default="$CLIENT_RCVBUF"
fi
netns_up
if [[ -n $SERVERS6 ]]; then
    ip -n "$SRV_NS" addr add 2001:2::1/64 dev veth-srv nodad
    ip -n "$CLI_NS" addr add 2001:2::2/64 dev veth-cli nodad
    # perfdhcp sends from the link-local address: wait until both ends are past DAD.
    for ns in "$SRV_NS" "$CLI_NS"; do
        for ((i = 0; i < 100; i++)); do
            ip -n "$ns" -6 addr show tentative | grep -q . || break
            sleep 0.1
        done
    done
fi

# --- servers: each start_<name> launches one fresh server with an empty lease db ---
start_paddock() {
    rm -rf "$SCRATCH/paddock-data"
    mkdir -p "$SCRATCH/paddock-data"
    paddock_config "$SCRATCH/paddock.toml" true $'[tftp]\nenabled = false'
    start_server paddock env PADDOCK_LOG="${PADDOCK_LOG:-warn}" PADDOCK_INSECURE=true \
        "$PADDOCK_BIN" serve --config "$SCRATCH/paddock.toml"
    wait_udp 67
}

start_kea() {
    rm -f "$SCRATCH"/kea-leases4.csv*
    cat >"$SCRATCH/kea-dhcp4.json" <<EOF
{ "Dhcp4": {
    "interfaces-config": { "interfaces": [ "veth-srv" ], "dhcp-socket-type": "udp" },
    "lease-database": { "type": "memfile", "persist": true, "lfc-interval": 0,
                        "name": "$SCRATCH/kea-leases4.csv" },
    "valid-lifetime": 3600,
    "subnet4": [ { "id": 1, "subnet": "198.18.0.0/15",
                   "pools": [ { "pool": "198.18.1.0 - 198.19.255.254" } ],
                   "option-data": [ { "name": "routers", "data": "$SRV_IP" } ] } ],
    "loggers": [ { "name": "kea-dhcp4", "severity": "WARN",
                   "output_options": [ { "output": "stdout" } ] } ]
} }
EOF
    mkdir -p /run/kea
    start_server kea env KEA_PIDFILE_DIR="$SCRATCH" KEA_LOCKFILE_DIR="$SCRATCH" \
        kea-dhcp4 -c "$SCRATCH/kea-dhcp4.json"
    wait_udp 67
}

start_paddock6() {
    rm -rf "$SCRATCH/paddock-data"
    mkdir -p "$SCRATCH/paddock-data"
    paddock_config "$SCRATCH/paddock.toml" false $'[tftp]\nenabled = false\n[dhcp6]\nenabled = true\ninterfaces = ["veth-srv"]\nper_client_burst = 0\nnew_leases_per_window = 0\n[[dhcp6.subnets]]\nnetwork = "2001:2::/64"\npools = ["2001:2::1:0-2001:2::ffff:ffff"]'
    start_server paddock env PADDOCK_LOG="${PADDOCK_LOG:-warn}" PADDOCK_INSECURE=true \
        "$PADDOCK_BIN" serve --config "$SCRATCH/paddock.toml"
    wait_udp 547
}

start_kea6() {
    rm -f "$SCRATCH"/kea-leases6.csv*
    cat >"$SCRATCH/kea-dhcp6.json" <<EOF
{ "Dhcp6": {
    "interfaces-config": { "interfaces": [ "veth-srv" ] },
    "lease-database": { "type": "memfile", "persist": true, "lfc-interval": 0,
                        "name": "$SCRATCH/kea-leases6.csv" },
    "server-id": { "type": "LL", "persist": false },
    "preferred-lifetime": 1800, "valid-lifetime": 3600,
    "subnet6": [ { "id": 1, "subnet": "2001:2::/64", "interface": "veth-srv",
                   "pools": [ { "pool": "2001:2::1:0 - 2001:2::ffff:ffff" } ] } ],
    "loggers": [ { "name": "kea-dhcp6", "severity": "WARN",
                   "output_options": [ { "output": "stdout" } ] } ]
} }
EOF
    mkdir -p /run/kea
    start_server kea env KEA_PIDFILE_DIR="$SCRATCH" KEA_LOCKFILE_DIR="$SCRATCH" \
        kea-dhcp6 -c "$SCRATCH/kea-dhcp6.json"
    wait_udp 547
}

start_dnsmasq() {
    : >"$SCRATCH/dnsmasq.leases"
    # The range carries its netmask so dnsmasq serves relayed requests from giaddr 198.18.0.2.
    start_server dnsmasq dnsmasq --no-daemon --quiet-dhcp --no-ping --no-resolv --no-hosts \
        --port=0 --interface=veth-srv --bind-interfaces --user=root --log-facility=- \
        --dhcp-range=198.18.1.0,198.19.255.254,255.254.0.0,1h --dhcp-authoritative \
        --dhcp-option=option:router,$SRV_IP --dhcp-lease-max=$POOL_SIZE \
        --dhcp-leasefile="$SCRATCH/dnsmasq.leases"
    wait_udp 67
}

# The server's CPU time so far (all its threads), in clock ticks.
server_ticks() { sed 's/^.*) //' "/proc/$SRV_PID/stat" | awk '{ print $12 + $13 }'; }
HZ=$(getconf CLK_TCK)

# client_drops: UDP datagrams perfdhcp's namespace dropped for a full receive buffer so far.
client_drops() {
    if [[ $FAMILY == 6 ]]; then
        ip netns exec "$CLI_NS" awk '$1 == "Udp6RcvbufErrors" { print $2 }' /proc/net/snmp6
    else
        ip netns exec "$CLI_NS" awk '$1 == "Udp:" && $2 ~ /^[0-9]+$/ { print $6 }' /proc/net/snmp
    fi
}

# run_step SERVER RATE: sets ACHIEVED (4-way/s, integer), DROPS (percent, 2 decimals) and
# PER_CPU (complete exchanges per second of the server's own CPU time).
run_step() {
    local srv=$1 rate=$2 out=$SCRATCH/perfdhcp$FAMILY-$1-$2.txt rc=0
    local pin=() threads=() first=DISCOVER-OFFER second=REQUEST-ACK
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 1) threads=(-g single)
    local target=(-4 -R "$CLIENTS" -l "$CLI_IP" "$SRV_IP")
    if [[ $FAMILY == 6 ]]; then
        "start_${srv}6"
        target=(-6 -R "$CLIENTS6" -l veth-cli)
        first=SOLICIT-ADVERTISE second=REQUEST-REPLY
    else
        "start_$srv"
    fi
    local ticks0 ticks1 lost0 lost1
    ticks0=$(server_ticks) lost0=$(client_drops)
    # -W: keep receiving for 1 s after the test period so in-flight replies are counted.
    "${pin[@]}" ip netns exec "$CLI_NS" timeout --foreground $((DURATION + 60)) \
        perfdhcp "${threads[@]}" -x e -r "$rate" -p "$DURATION" -W 1000000 "${target[@]}" \
        >"$out" 2>&1 || rc=$?
    [[ -r /proc/$SRV_PID/stat ]] || die "$srv exited during the step at rate $rate (log: $SRV_LOG)"
    ticks1=$(server_ticks) lost1=$(client_drops)
    stop_server
    # perfdhcp exits 3 when some exchanges were not completed; that is a result, not an error.
    # `-x e` prints the exit reason: anything but the test period ending (e.g. ^C) is an error.
    if [[ $rc -ne 0 && $rc -ne 3 ]] || ! grep -q 'reached test-period' "$out" ||
        ! grep -q "Statistics for: $second" "$out"; then
        cat "$out" >&2
        die "perfdhcp failed or was interrupted (exit $rc) against $srv at rate $rate"
    fi
    read -r ACHIEVED DROPS PER_CPU SENT < <(awk -v dur="$DURATION" -v first="$first" -v second="$second" \
        -v cpu_ms="$(((ticks1 - ticks0) * 1000 / HZ))" '
        $0 ~ "Statistics for: " first  { sec = "DO" }
        $0 ~ "Statistics for: " second { sec = "RA" }
        /^sent packets:/     { sent[sec] = $3 }
        /^received packets:/ { recv[sec] = $3 }
        /^drops:/            { drop[sec] = $2 }
        END {
            pct = sent["DO"] > 0 ? 100 * (drop["DO"] + drop["RA"]) / sent["DO"] : 100
            printf "%d %.2f %d %d\n", recv["RA"] / dur, pct, (cpu_ms > 0 ? recv["RA"] * 1000 / cpu_ms : 0), sent["DO"] / dur
        }' "$out")
    echo "dhcp$([[ $FAMILY == 6 ]] && echo 6) $srv rate=$rate sent=$SENT/s achieved=$ACHIEVED/s drops=$DROPS%" \
        "server_cpu_s=$(calc "sprintf(\"%.2f\", $((ticks1 - ticks0)) / $HZ)") per_cpu_s=$PER_CPU" \
        "client_rcvbuf_drops=$((lost1 - lost0))"
}

# consider RATE: one step for $srv; keeps the best passing (< 1 % failures) result.
consider() {
    run_step "$srv" "$1"
    if awk -v d="$DROPS" 'BEGIN { exit !(d < 1) }'; then
        if ((ACHIEVED > best)); then
            best=$ACHIEVED best_drops=$DROPS best_per_cpu=$PER_CPU best_rate=$1 best_sent=$SENT
        fi
        return 0
    fi
    return 1
}

# search SERVERS...: the highest passing rate of each server, into MAX and MAXDROPS.
declare -A MAX MAXDROPS PERCPU RATE SENT_AT
search() {
    local srv
    for srv in "$@"; do
        log "benchmarking $srv over DHCPv$FAMILY (${DURATION}s per step)"
        best=0 best_drops=n/a best_per_cpu=0 best_rate=0 best_sent=0 good=0 bad=0
        for rate in $RATES; do
            if consider "$rate"; then good=$rate; else bad=$rate; break; fi
        done
        if ((good == 0 && bad > 0)); then # even the first rate failed: go down
            rate=$((bad / 2))
            while ((rate >= 50)); do
                if consider "$rate"; then good=$rate; break; fi
                bad=$rate rate=$((rate / 2))
            done
        fi
        ((bad > 0)) || log "note: $srv never reached 1 % failures; add higher RATES"
        for ((i = 0; i < BISECT && good > 0 && bad > good + good / 20; i++)); do
            rate=$(((good + bad) / 2))
            if consider "$rate"; then good=$rate; else bad=$rate; fi
        done
        MAX[$FAMILY$srv]=$best MAXDROPS[$FAMILY$srv]=$best_drops PERCPU[$FAMILY$srv]=$best_per_cpu
        RATE[$FAMILY$srv]=$best_rate SENT_AT[$FAMILY$srv]=$best_sent
    done
}

# ratio A B: A/B to two places, or n/a.
ratio() {
    if [[ -n ${1:-} && -n ${2:-} ]] && (($2 > 0)); then
        calc "sprintf(\"%.2f\", $1 / $2)"
    else
        echo n/a
    fi
}

search $SERVERS
FAMILY=6
search $SERVERS6

echo
for srv in $SERVERS; do
    echo "dhcp $srv max_rate=${MAX[4$srv]} drops=${MAXDROPS[4$srv]}"
done
if [[ -n ${MAX[4paddock]:-} && -n ${MAX[4kea]:-} ]]; then
    echo "dhcp ratio paddock/kea=$(ratio "${MAX[4paddock]}" "${MAX[4kea]}")"
    echo "dhcp per_cpu_s paddock=${PERCPU[4paddock]} kea=${PERCPU[4kea]}" \
        "ratio=$(ratio "${PERCPU[4paddock]}" "${PERCPU[4kea]}")"
fi
if [[ -n ${MAX[6paddock]:-} && -n ${MAX[6kea]:-} ]]; then
    echo "dhcp6 paddock=${MAX[6paddock]} kea=${MAX[6kea]} ratio=$(ratio "${MAX[6paddock]}" "${MAX[6kea]}")"
    echo "dhcp6 per_cpu_s paddock=${PERCPU[6paddock]} kea=${PERCPU[6kea]}" \
        "ratio=$(ratio "${PERCPU[6paddock]}" "${PERCPU[6kea]}")"
fi
# A server's best figure is the generator's where perfdhcp sent less than 97 % of the rate
# asked of it at that step: the server may serve more than this rig can offer.
for key in $(printf '4%s ' $SERVERS) $(printf '6%s ' $SERVERS6); do
    if ((${RATE[$key]:-0} > 0 && SENT_AT[$key] * 100 < RATE[$key] * 97)); then
        echo "dhcp$([[ ${key:0:1} == 6 ]] && echo 6) ${key:1} generator_bound=yes (at its best step" \
            "perfdhcp sent ${SENT_AT[$key]}/s of the ${RATE[$key]}/s asked: the figure is the rig's ceiling)"
    fi
done
