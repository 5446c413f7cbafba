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
#   3. dnsperf, in the client namespace, sends the same query file to each for SECONDS:
#      60 % machine A, 20 % SRV at _svc._tcp, 10 % service A, 10 % names that do not exist.
#   4. CHANGES hard changes (an instance registered, then revoked, by turns): the time from
#      the API's answer until Paddock's DNS answers the new state.
# Prints
#   dns qps paddock=<q> bind=<q> nsd=<q> knot=<q> best_peer=<q> ratio=<paddock/best_peer>
#   dns update p50_ms=<t> p99_ms=<t> max_ms=<t>                 (goals: ratio >= 1.0, p99 <= 1000)
# Run as root (network namespaces):  bash bench/dns.sh
# Env: MACHINES=10000 SERVICES=1000 PER=3 SECONDS=15 CHANGES=1000 CLIENTS=20
#      PIN_CPUS=1: every server on CPU 0 and dnsperf on CPU 1 (else all share both cores)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_init dns
MACHINES=${MACHINES:-10000}
SERVICES=${SERVICES:-1000}
PER=${PER:-3}
SECONDS_EACH=${SECONDS:-15}
CHANGES=${CHANGES:-1000}
CLIENTS=${CLIENTS:-20}
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

# The zone, once every machine and instance is in it.
want=$((MACHINES * 4 + SERVICES * PER * 2))
for ((i = 0; i < 300; i++)); do
    in_cli dig @"$SRV_IP" +nocmd +nostats +nocomments AXFR "$ZONE" >"$SCRATCH/zone.axfr"
    have=$(grep -c -E '\s(A|TXT)\s' "$SCRATCH/zone.axfr" || true)
    ((have >= want)) && break
    sleep 0.5
done
((have >= want)) || die "the zone holds $have A/TXT records, expected at least $want"
# dig prints the SOA first and last: the zone file keeps one.
awk '$4 == "SOA" && seen++ { next } { print }' "$SCRATCH/zone.axfr" >"$SCRATCH/$ZONE.zone"
log "zone: $(grep -c . "$SCRATCH/$ZONE.zone") records"
in_cli python3 bench/dns.py queries "$SCRATCH/queries" "$MACHINES" "$SERVICES" 100000

# perf NAME IP: dnsperf's queries per second against IP.
perf() {
    local out
    local pin=()
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 1) # servers on CPU 0 (lib.sh's start_server)
    out=$(in_cli "${pin[@]}" dnsperf -s "$2" -d "$SCRATCH/queries" -l "$SECONDS_EACH" -c "$CLIENTS" -T 2 -q 500 2>&1) ||
        { echo "$out" >&2; die "dnsperf against $1 failed"; }
    echo "$out" >"$SCRATCH/dnsperf-$1.txt"
    awk '/Queries per second:/ { printf "%.0f", $4 }' <<<"$out"
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
    log "$name: $q qps"
    stop_peer
    echo "$q"
}

q_paddock=$(perf paddock "$SRV_IP")
log "paddock: $q_paddock qps"

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
q_bind=$(peer bind "$BIND_IP" named -g -c "$SCRATCH/bind/named.conf")

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
q_nsd=$(peer nsd "$NSD_IP" nsd -d -c "$SCRATCH/nsd/nsd.conf")

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
q_knot=$(peer knot "$KNOT_IP" knotd -c "$SCRATCH/knot/knot.conf")

best=$(printf '%s\n' "$q_bind" "$q_nsd" "$q_knot" | sort -n | tail -1)
echo "dns qps paddock=$q_paddock bind=$q_bind nsd=$q_nsd knot=$q_knot best_peer=$best ratio=$(awk -v a="$q_paddock" -v b="$best" 'BEGIN { printf "%.2f", a / b }')"

# Update latency, against the appliance (running all along).
read -r p50 p99 max < <(in_cli python3 bench/dns.py updates "$URL" "$SRV_IP" "$CHANGES")
echo "dns update p50_ms=$p50 p99_ms=$p99 max_ms=$max"
