#!/usr/bin/env bash
# Service-discovery DNS: Paddock's server against the authoritative servers Debian packages
# (BIND named, NSD, Knot), serving the same zone, asked by dnsperf from another namespace.
#   1. The real `paddock serve` (release build, insecure: the API only fills it; DNS is the
#      same either way) in the server namespace, with MACHINES machines enrolled (each with a
#      DHCP reservation, so each name has an address), a role spec of SERVICES roles each
#      declaring a port (SRV), and PER instances of each registered in the census.
#   2. Paddock's zone, transferred from it (AXFR), is the zone file the peers load, each on an
#      address of its own in the same namespace; response rate limiting off everywhere (NSD's
#      is on by default) so that one dnsperf client is not throttled.
#   3. dnsperf, in the client namespace, sends the same query file to each for RUN_SECS:
#      60 % machine A, 20 % SRV at _svc._tcp, 10 % service A, 10 % names that do not exist.
#   4. CHANGES hard changes (an instance registered, then revoked, by turns): the time from
#      the API's answer until Paddock's DNS answers the new state.
# Prints
#   dns qps paddock=<q> bind=<q> nsd=<q> knot=<q> best_peer=<q> ratio=<paddock/best_peer>
#   dns cpu_us_per_query paddock=<µs> … least_peer=<µs> ratio=<least_peer/paddock>
#   dns update p50_ms=<t> p99_ms=<t> max_ms=<t>                 (goals: ratio >= 1.0, p99 <= 1000)
# Run as root (network namespaces):  bash bench/dns.sh
# Env: PEERS="bind nsd knot" RUNS=1 (each run measures every server in turn; medians printed)
#      MACHINES=10000 SERVICES=1000 PER=3 RUN_SECS=15 CHANGES=1000 CLIENTS=20 RATE=50000 (the
#      fixed rate of the CPU measurement, 10 s; dnsperf takes most of the CPU flat out, so
#      the qps figure says as much about how much CPU a server leaves it as about the server)
#      PIN_CPUS=1: every server on CPU 0 and dnsperf on CPU 1 (else all share both cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init dns
MACHINES=${MACHINES:-10000}
SERVICES=${SERVICES:-1000}
PER=${PER:-3}
# (Not SECONDS: bash counts the seconds since it started in that variable.)
SECONDS_EACH=${RUN_SECS:-15}
CHANGES=${CHANGES:-1000}
CLIENTS=${CLIENTS:-20}
RATE=${RATE:-50000}
PEERS=${PEERS:-bind nsd knot}
RUNS=${RUNS:-1}
BIN=$ROOT/target/release/paddock
ZONE=paddock.internal
BIND_IP=198.18.0.11
NSD_IP=198.18.0.12
KNOT_IP=198.18.0.13
URL=http://$SRV_IP:8080

bench_deps
cargo build --release --locked -q -p paddock --bin paddock
netns_up
for ip in $BIND_IP $NSD_IP $KNOT_IP; do ip -n "$SRV_NS" addr add "$ip/24" dev veth-srv; done
in_srv() { ip netns exec "$SRV_NS" "$@"; }
in_cli() { ip netns exec "$CLI_NS" "$@"; }

# The appliance: DHCP configured (its reservations give the machines their addresses; the
# bench's client never asks it for a lease), DNS on with the transfer open to the client.
{
    cat <<EOF
data_dir = "$SCRATCH/data"
[security]
insecure = true
[http]
listen = "$SRV_IP:8080"
[tftp]
enabled = false
[dns]
enabled = true
allow_transfer = ["$CLI_IP/32"]
responses_per_second = 0
[dhcp]
interfaces = ["veth-srv"]
[[dhcp.subnets]]
network = "198.18.0.0/15"
pools = ["198.18.0.100-198.18.0.199"]
EOF
    for ((i = 0; i < MACHINES; i++)); do
        printf '[[dhcp.reservations]]\nmac = "52:54:0d:%02x:%02x:%02x"\nip = "198.18.%d.%d"\n' \
            $((i >> 16 & 255)) $((i >> 8 & 255)) $((i & 255)) $((i / 250 + 1)) $((i % 250 + 1))
    done
} >"$SCRATCH/paddock.toml"
start_server paddock env PADDOCK_LOG=warn "$BIN" serve --config "$SCRATCH/paddock.toml"
PADDOCK_PID=$SRV_PID
wait_udp 53
for ((i = 0; i < 100; i++)); do
    in_cli curl -sf -m 1 -o /dev/null "$URL/healthz" && break
    sleep 0.1
done
in_cli python3 bench/dns.py fill "$URL" "$MACHINES" "$SERVICES" "$PER"

# The zone, once every machine and instance is in it (each machine's A at its name, each
# instance's TXT at its .inst name): the peers must serve the same names.
count() { grep -c -E "$1" "$SCRATCH/zone.axfr" || true; }
for ((i = 0; i < 300; i++)); do
    in_cli dig @"$SRV_IP" +nocmd +nostats +nocomments AXFR "$ZONE" >"$SCRATCH/zone.axfr"
    machines=$(count "^m[0-9]+\.$ZONE\.\s.*\sA\s")
    instances=$(count "\.inst\.$ZONE\.\s.*\sTXT\s")
    ((machines == MACHINES && instances == SERVICES * PER)) && break
    sleep 0.5
done
((machines == MACHINES && instances == SERVICES * PER)) ||
    die "the zone holds $machines machines and $instances instances, not $MACHINES and $((SERVICES * PER))"
# dig prints the SOA first and last: the zone file keeps one.
awk '$4 == "SOA" && seen++ { next } { print }' "$SCRATCH/zone.axfr" >"$SCRATCH/$ZONE.zone"
log "zone: $(grep -c . "$SCRATCH/$ZONE.zone") records"
in_cli python3 bench/dns.py queries "$SCRATCH/queries" "$MACHINES" "$SERVICES" 100000

# cpu_ticks PID: the CPU time (clock ticks, user + system) of PID and its descendants.
cpu_ticks() {
    local pids=("$1") i=0 kids
    while ((i < ${#pids[@]})); do
        kids=$(cat /proc/"${pids[i]}"/task/*/children 2>/dev/null || true)
        for k in $kids; do pids+=("$k"); done
        i=$((i + 1))
    done
    for p in "${pids[@]}"; do cat /proc/"$p"/stat 2>/dev/null; done |
        awk '{ sub(/^.*\) /, ""); t += $12 + $13 } END { print t + 0 }'
}
# dnsperf_run NAME IP TAG ARGS...: dnsperf against IP; its whole output.
dnsperf_run() {
    local name=$1 ip=$2 tag=$3 out
    shift 3
    local pin=()
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 1) # servers on CPU 0 (lib.sh's start_server)
    out=$(in_cli "${pin[@]}" dnsperf -s "$ip" -d "$SCRATCH/queries" -c "$CLIENTS" -T 2 -q 500 "$@" 2>&1) ||
        { echo "$out" >&2; die "dnsperf against $name failed"; }
    echo "$out" >"$SCRATCH/dnsperf-$name-$tag.txt"
    echo "$out"
}
# perf NAME IP: dnsperf's queries per second against IP, flat out; then the server's CPU
# time per query at a fixed RATE (both cores shared with dnsperf, the first figure
# depends on how much CPU dnsperf leaves the server; the second does not). Prints
# "<qps> <cpu µs per query>".
perf() {
    local out qps t0 t1 answered
    out=$(dnsperf_run "$1" "$2" max -l "$SECONDS_EACH")
    qps=$(awk '/Queries per second:/ { printf "%.0f", $4 }' <<<"$out")
    t0=$(cpu_ticks "$SRV_PID")
    out=$(dnsperf_run "$1" "$2" rate -l 10 -Q "$RATE")
    t1=$(cpu_ticks "$SRV_PID")
    answered=$(awk '/Queries completed:/ { print $3 }' <<<"$out")
    echo "$qps $(awk -v d=$((t1 - t0)) -v n="$answered" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.2f", (n > 0 ? d / hz * 1e6 / n : 0) }')"
}
# stop_peer: the peer started last, stopped; the appliance is the server again.
stop_peer() {
    kill "$SRV_PID" 2>/dev/null
    wait "$SRV_PID" 2>/dev/null || true
    SRV_PID=$PADDOCK_PID
}
# answering NAME IP: wait until IP answers for the zone (its SOA).
answering() {
    local i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$SRV_PID" 2>/dev/null || { tail -n 20 "$SRV_LOG" >&2; die "$1 exited (log: $SRV_LOG)"; }
        in_cli dig @"$2" +time=1 +tries=1 SOA "$ZONE" | grep -q 'status: NOERROR' && return 0
        sleep 0.2
    done
    tail -n 20 "$SRV_LOG" >&2
    die "$1 does not answer for $ZONE"
}

# peer NAME IP CMD...: starts the peer, waits for its answers, measures it, stops it.
peer() {
    local name=$1 ip=$2 q
    shift 2
    start_server "$name" "$@"
    answering "$name" "$ip"
    q=$(perf "$name" "$ip")
    log "$name: ${q% *} qps, ${q#* } µs CPU per query at $RATE q/s"
    stop_peer
    echo "$q"
}

# BIND named.
mkdir -p "$SCRATCH/bind"
cat >"$SCRATCH/bind/named.conf" <<EOF
options {
    directory "$SCRATCH/bind";
    pid-file "$SCRATCH/bind/named.pid";
    session-keyfile "$SCRATCH/bind/session.key";
    listen-on port 53 { $BIND_IP; };
    listen-on-v6 { none; };
    recursion no;
    dnssec-validation no;
    notify no;
};
zone "$ZONE" { type primary; file "$SCRATCH/$ZONE.zone"; };
EOF

# NSD.
mkdir -p "$SCRATCH/nsd"
cat >"$SCRATCH/nsd/nsd.conf" <<EOF
server:
    ip-address: $NSD_IP
    port: 53
    username: ""
    chroot: ""
    zonesdir: "$SCRATCH"
    pidfile: "$SCRATCH/nsd/nsd.pid"
    database: ""
    zonelistfile: "$SCRATCH/nsd/zone.list"
    xfrdfile: "$SCRATCH/nsd/xfrd.state"
    xfrdir: "$SCRATCH/nsd"
    server-count: 2
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
remote-control:
    control-enable: no
zone:
    name: "$ZONE"
    zonefile: "$SCRATCH/$ZONE.zone"
EOF

# Knot.
mkdir -p "$SCRATCH/knot"
cat >"$SCRATCH/knot/knot.conf" <<EOF
server:
    rundir: "$SCRATCH/knot"
    listen: $KNOT_IP@53
    udp-workers: 2
database:
    storage: "$SCRATCH/knot"
zone:
  - domain: $ZONE
    file: "$SCRATCH/$ZONE.zone"
    journal-content: none
    zonefile-load: whole
EOF

# Each run measures every server once, in turn; the figures are each server's median.
declare -A QPS CPU
for ((run = 1; run <= RUNS; run++)); do
    read -r q c < <(perf paddock "$SRV_IP")
    log "run $run: paddock: $q qps, $c µs CPU per query at $RATE q/s"
    QPS[paddock]+="$q " CPU[paddock]+="$c "
    for name in $PEERS; do
        case $name in
        bind) read -r q c < <(peer bind "$BIND_IP" named -g -c "$SCRATCH/bind/named.conf") ;;
        nsd) read -r q c < <(peer nsd "$NSD_IP" nsd -d -c "$SCRATCH/nsd/nsd.conf") ;;
        knot) read -r q c < <(peer knot "$KNOT_IP" knotd -c "$SCRATCH/knot/knot.conf") ;;
        *) die "PEERS: $name is not one of bind, nsd, knot" ;;
        esac
        QPS[$name]+="$q " CPU[$name]+="$c "
    done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
qps_line="paddock=$(median "${QPS[paddock]}")" cpu_line="paddock=$(median "${CPU[paddock]}")"
best=0 least=
for name in $PEERS; do
    q=$(median "${QPS[$name]}") c=$(median "${CPU[$name]}")
    qps_line+=" $name=$q" cpu_line+=" $name=$c"
    ((q > best)) && best=$q
    if [[ -z $least ]] || awk -v a="$c" -v b="$least" 'BEGIN { exit !(a < b) }'; then least=$c; fi
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
echo "dns qps $qps_line best_peer=$best ratio=$(ratio "$(median "${QPS[paddock]}")" "$best")"
echo "dns cpu_us_per_query $cpu_line least_peer=$least ratio=$(ratio "$least" "$(median "${CPU[paddock]}")")"

# Update latency, against the appliance (running all along).
read -r p50 p99 max < <(in_cli python3 bench/dns.py updates "$URL" "$SRV_IP" "$CHANGES")
echo "dns update p50_ms=$p50 p99_ms=$p99 max_ms=$max"
