# Shared helpers for the benches (sourced, not run).
#
# Provides: package installation, two network namespaces joined by a veth
# pair (server 198.18.0.1/24 on veth-srv, client 198.18.0.2/24 on veth-cli),
# server start/stop with readiness polling, and a cleanup trap that kills
# everything the script started and deletes the namespaces, even on failure.
# For the benches with no peer (console.sh, dominator.sh): one namespace with
# only lo and one background process, with the same kind of cleanup trap.
# Every bench marks its processes and checks at exit that none survived
# (bench_reap; bench_guard for the benches with none of the above).
# shellcheck shell=bash

SRV_NS=pdk-bench-srv
CLI_NS=pdk-bench-cli
SRV_IP=198.18.0.1
CLI_IP=198.18.0.2
SRV_PID=
SCRATCH=

die() { echo "error: $*" >&2; exit 1; }
log() { echo "# $*" >&2; }

# Every process a bench starts carries PADDOCK_BENCH_RUN in its environment. At exit the
# bench's clean-up stops what it started, then bench_reap finds whatever still carries the
# mark (a server that escaped its namespace, re-parented to init), names it, stops it and
# fails the bench. Nothing without the mark is ever touched.

# bench_mark NAME: this run's mark, inherited by everything started from here on.
bench_mark() {
    export PADDOCK_BENCH_RUN="$1-$$-$EPOCHSECONDS"
}

# bench_leftovers: the live processes carrying this run's mark, but this shell.
bench_leftovers() {
    local f pid
    for f in $(grep -lxzs "PADDOCK_BENCH_RUN=$PADDOCK_BENCH_RUN" /proc/[0-9]*/environ); do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        kill -0 "$pid" 2>/dev/null && echo "$pid"
    done
    return 0
}

# bench_reap: 0 when nothing of this run survived its clean-up; else names the survivors,
# stops them (SIGTERM, then SIGKILL after 5 s) and returns 1.
bench_reap() {
    [[ -n ${PADDOCK_BENCH_RUN:-} ]] || return 0
    local pids i
    pids=$(bench_leftovers)
    [[ -n $pids ]] || return 0
    echo "error: the bench's clean-up left these running (stopped now):" >&2
    ps -o pid=,args= -p "$(paste -sd, <<<"$pids")" >&2
    kill $pids 2>/dev/null
    for ((i = 0; i < 50; i++)); do
        [[ -n $(bench_leftovers) ]] || return 1
        sleep 0.1
    done
    kill -9 $(bench_leftovers) 2>/dev/null
    return 1
}

# bench_guard NAME [CLEANUP]: for a bench without bench_init or lone_ns_trap: marks the run,
# and at exit calls the function CLEANUP (if given), then bench_reap; a survivor fails the
# bench.
bench_guard() {
    bench_mark "$1"
    BENCH_CLEANUP=${2:-}
    trap bench_guard_exit EXIT
    trap 'exit 130' INT TERM
}

bench_guard_exit() {
    local rc=$?
    set +e
    [[ -n $BENCH_CLEANUP ]] && "$BENCH_CLEANUP"
    bench_reap || { ((rc != 0)) || rc=1; }
    exit "$rc"
}

# bench_init NAME: root check, cd to the repo root, scratch dir, cleanup trap.
bench_init() {
    [[ $EUID -eq 0 ]] || die "run as root (network namespaces, ports 67/69)"
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    ROOT=$PWD
    mkdir -p "$ROOT/bench/out"
    SCRATCH=$(mktemp -d "$ROOT/bench/out/$1.XXXXXX")
    chmod 755 "$SCRATCH"
    bench_mark "$1"
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local rc=$?
    set +e
    # A bench that changed something of the host's (a sysctl) defines bench_restore.
    if declare -F bench_restore >/dev/null; then bench_restore; fi
    stop_server
    netns_down
    bench_reap || { ((rc != 0)) || rc=1; }
    if [[ -n $SCRATCH && -d $SCRATCH ]]; then
        if [[ ($rc -ne 0 || ${KEEP_SCRATCH:-0} == 1) && -n $(ls -A "$SCRATCH") ]]; then
            find "$SCRATCH" -name '*.bin' -delete 2>/dev/null
            log "exit $rc; logs kept in $SCRATCH"
        else
            rm -rf "$SCRATCH"
        fi
    fi
    exit "$rc"
}

# lone_ns_trap NS: for a bench in one namespace NS (lo only) with one background process
# ($BG_PID): an EXIT trap that stops the process, deletes NS and removes $SCRATCH (kept, and
# said so, when the script failed).
lone_ns_trap() {
    LONE_NS=$1
    BG_PID=
    bench_mark "$LONE_NS"
    trap lone_ns_cleanup EXIT
    trap 'exit 130' INT TERM
}

lone_ns_cleanup() {
    local rc=$?
    set +e
    if [[ -n $BG_PID ]]; then
        kill "$BG_PID" 2>/dev/null
        wait "$BG_PID" 2>/dev/null
    fi
    ip netns pids "$LONE_NS" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$LONE_NS" 2>/dev/null
    bench_reap || { ((rc != 0)) || rc=1; }
    if [[ -n $SCRATCH && -d $SCRATCH ]]; then
        if [[ $rc -ne 0 ]]; then log "exit $rc; logs kept in $SCRATCH"; else rm -rf "$SCRATCH"; fi
    fi
    exit "$rc"
}

# lone_ns_up NAME: the scratch directory (bench/out/NAME.XXXXXX) and the namespace, afresh.
lone_ns_up() {
    mkdir -p "$ROOT/bench/out"
    SCRATCH=$(mktemp -d "$ROOT/bench/out/$1.XXXXXX")
    [[ -e /run/netns/$LONE_NS ]] && ip netns del "$LONE_NS"
    ip netns add "$LONE_NS"
    ip -n "$LONE_NS" link set lo up
}

# bench_deps: every package the benches use, from the one list (scripts/install-deps.sh --bench).
bench_deps() {
    "$(dirname "${BASH_SOURCE[0]}")/../scripts/install-deps.sh" --bench >&2
}

netns_up() {
    netns_down
    ip netns add "$SRV_NS"
    ip netns add "$CLI_NS"
    # Created directly inside the namespaces: nothing ever appears in the root namespace.
    ip link add veth-srv netns "$SRV_NS" type veth peer name veth-cli netns "$CLI_NS"
    ip -n "$SRV_NS" addr add "$SRV_IP/24" dev veth-srv
    ip -n "$CLI_NS" addr add "$CLI_IP/24" dev veth-cli
    local ns
    for ns in "$SRV_NS" "$CLI_NS"; do ip -n "$ns" link set lo up; done
    ip -n "$SRV_NS" link set veth-srv up
    ip -n "$CLI_NS" link set veth-cli up
}

netns_down() {
    local ns pids
    for ns in "$SRV_NS" "$CLI_NS"; do
        [[ -e /run/netns/$ns ]] || continue
        # Only processes inside our own namespaces, i.e. ones this script started.
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [[ -n $pids ]] && kill -9 $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null || true
    done
    return 0
}

# start_server NAME CMD...: run CMD in the server namespace, log to $SCRATCH/NAME.log.
# `ip netns exec` execs CMD, so $! is the server's own pid.
start_server() {
    local name=$1; shift
    SRV_LOG=$SCRATCH/$name.log
    local pin=()
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 0) # server on CPU 0, client on CPU 1
    "${pin[@]}" ip netns exec "$SRV_NS" "$@" >"$SRV_LOG" 2>&1 &
    SRV_PID=$!
}

# wait_udp PORT: wait until something in the server namespace is bound to UDP PORT.
wait_udp() {
    local port=$1 i
    for ((i = 0; i < 100; i++)); do
        if ! kill -0 "$SRV_PID" 2>/dev/null; then
            tail -n 20 "$SRV_LOG" >&2
            die "server exited during startup (log: $SRV_LOG)"
        fi
        if ip netns exec "$SRV_NS" ss -Hlun "sport = :$port" | grep -q .; then
            sleep 0.3
            return 0
        fi
        sleep 0.1
    done
    tail -n 20 "$SRV_LOG" >&2
    die "server not listening on UDP $port after 10 s (log: $SRV_LOG)"
}

stop_server() {
    [[ -n $SRV_PID ]] || return 0
    local i
    kill "$SRV_PID" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SRV_PID" 2>/dev/null || true
    wait "$SRV_PID" 2>/dev/null || true
    SRV_PID=
}

# paddock_bin: resolve $PADDOCK_BIN (relative to the repo root); unset, build the release
# binary.
paddock_bin() {
    if [[ -z ${PADDOCK_BIN:-} ]]; then
        (cd "$ROOT" && cargo build --release --locked -q -p paddock)
    fi
    PADDOCK_BIN=${PADDOCK_BIN:-target/release/paddock}
    [[ $PADDOCK_BIN == /* ]] || PADDOCK_BIN=$ROOT/$PADDOCK_BIN
    if [[ ! -x $PADDOCK_BIN ]]; then
        echo "error: Paddock binary not found at $PADDOCK_BIN" >&2
        echo "       build it first:  cargo build --release -p paddock" >&2
        echo "       (or set PADDOCK_BIN=/path/to/paddock, or leave paddock out of SERVERS)" >&2
        exit 1
    fi
}

# paddock_config FILE DHCP_ENABLED TAIL [HTTP_EXTRA]: the TOML `paddock serve` reads; TAIL
# (the [tftp] table and any after it) goes last, HTTP_EXTRA into [http].
paddock_config() {
    local file=$1 dhcp_enabled=$2 tftp_block=$3 http_extra=${4:-}
    cat >"$file" <<EOF
data_dir = "$SCRATCH/paddock-data"

[http]
listen = "$SRV_IP:8080"
public_url = "http://$SRV_IP:8080"
$http_extra

[dhcp]
$([[ $dhcp_enabled == true ]] || echo "enabled = false")
interfaces = ["veth-srv"]
# The benches measure the server, not its rate limits (perfdhcp is a random-MAC flood by design).
per_client_burst = 0
new_leases_per_window = 0

[[dhcp.subnets]]
network = "198.18.0.0/15"
pools = ["198.18.1.0-198.19.255.254"]
routers = ["$SRV_IP"]
lease_time = 3600

$tftp_block
EOF
}

# calc EXPR: evaluate a floating-point awk expression.
calc() { awk "BEGIN { print $1 }"; }
