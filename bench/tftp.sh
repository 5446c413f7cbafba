#!/usr/bin/env bash
# TFTP download benchmark: Paddock vs tftpd-hpa (in.tftpd) vs dnsmasq.
#
# What it measures: wall-clock time to download an 8 MiB and a 64 MiB file of
# random bytes over a veth pair (MTU 1500) between two network namespaces,
# best of RUNS runs per case; every download is checked byte for byte with cmp
# (a mismatch fails the script). Cases (client:blksize:windowsize):
#   tftp-hpa:512:1    tftp-hpa's `tftp` client (no RFC 2347 options at all: 512-byte blocks)
#   atftp:512:1       atftp without options
#   atftp:1468:1      atftp, blksize 1468 (largest block that fits a 1500-byte MTU)
#   atftp:1468:16     atftp, blksize 1468 + windowsize 16 (RFC 7440)
# The windowsize= field shows what the server granted (probed with atftp --trace);
# tftpd-hpa and dnsmasq ignore windowsize, so they run that case lock-step.
# The 64 MiB file at 512-byte blocks needs 131073 blocks: the block number wraps.
#
# Servers, each listening on 198.18.0.1:69 in namespace pdk-bench-srv:
#   paddock   "$PADDOCK_BIN" serve --config <toml with [dhcp] enabled=false, [tftp] enabled=true>
#   tftp-hpa  in.tftpd --foreground --address 198.18.0.1:69 --secure <root>
#   dnsmasq   dnsmasq --port=0 --enable-tftp --tftp-root=<root>
# Summary: time ratios for the 64 MiB file, atftp, blksize 1468, windowsize 1
# (lower is better for Paddock), and the same with windowsize 16 requested.
#
# Run (as root):  bash bench/tftp.sh
# Env knobs:
#   SERVERS="paddock tftp-hpa dnsmasq"   subset/order of servers
#   PADDOCK_BIN=target/release/paddock  (relative to the repo root, or absolute)
#   PADDOCK_LOG=warn  Paddock's log filter (tracing EnvFilter syntax)
#   RUNS=3            runs per case (best one is reported)
#   SIZES="8 64"      file sizes in MiB
#   CASES="tftp-hpa:512:1 atftp:512:1 atftp:1468:1 atftp:1468:16"
#   PIN_CPUS=0        1: pin the server to CPU 0 and the client to CPU 1
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SERVERS=${SERVERS:-paddock tftp-hpa dnsmasq}
RUNS=${RUNS:-3}
SIZES=${SIZES:-8 64}
CASES=${CASES:-tftp-hpa:512:1 atftp:512:1 atftp:1468:1 atftp:1468:16}

bench_init tftp
for s in $SERVERS; do
    case $s in paddock | tftp-hpa | dnsmasq) ;; *) die "unknown server '$s' in SERVERS" ;; esac
done
[[ " $SERVERS " == *" paddock "* ]] && paddock_bin
bench_deps
netns_up

TROOT=$SCRATCH/tftp-root
DL=$SCRATCH/dl
mkdir -p "$TROOT" "$DL"
chmod 755 "$TROOT" "$DL"
log "creating test files"
for mib in $SIZES; do head -c $((mib << 20)) /dev/urandom >"$TROOT/${mib}MiB.bin"; done
head -c 4096 /dev/urandom >"$TROOT/probe.bin"
chmod 644 "$TROOT"/*.bin

start_paddock() {
    mkdir -p "$SCRATCH/paddock-data"
    paddock_config "$SCRATCH/paddock.toml" false "[tftp]
enabled = true
listen = [\"$SRV_IP:69\"]
root = \"$TROOT\""
    start_server paddock env PADDOCK_LOG="${PADDOCK_LOG:-warn}" PADDOCK_INSECURE=true \
        "$PADDOCK_BIN" serve --config "$SCRATCH/paddock.toml"
}
start_tftp-hpa() {
    start_server tftp-hpa in.tftpd --foreground --address "$SRV_IP:69" --secure "$TROOT"
}
start_dnsmasq() {
    start_server dnsmasq dnsmasq --no-daemon --port=0 --no-resolv --no-hosts \
        --listen-address="$SRV_IP" --bind-interfaces --user=root --log-facility=- \
        --enable-tftp --tftp-root="$TROOT"
}

# client_cmd CLIENT BLKSIZE WINDOWSIZE FILE OUT: the download command (client namespace).
client_cmd() {
    local client=$1 bs=$2 ws=$3 file=$4 out=$5
    CMD=(ip netns exec "$CLI_NS" timeout --foreground 600)
    if [[ $client == tftp-hpa ]]; then
        [[ $bs == 512 && $ws == 1 ]] || die "tftp-hpa's client only does blksize 512, windowsize 1"
        CMD+=(tftp -m binary "$SRV_IP" -c get "$file" "$out")
    else
        CMD+=(atftp)
        [[ $bs == 512 ]] || CMD+=(--option "blksize $bs")
        [[ $ws == 1 ]] || CMD+=(--option "windowsize $ws")
        CMD+=(-g -r "$file" -l "$out" "$SRV_IP")
    fi
}

# granted_ws BLKSIZE WINDOWSIZE: the windowsize the server grants (from the OACK).
granted_ws() {
    [[ $2 == 1 ]] && { echo 1; return; }
    local oack
    oack=$(ip netns exec "$CLI_NS" timeout --foreground 30 atftp --trace --option "blksize $1" \
        --option "windowsize $2" -g -r probe.bin -l "$DL/probe.out" "$SRV_IP" 2>&1 |
        grep -m1 'received OACK' || true)
    rm -f "$DL/probe.out"
    [[ $oack =~ windowsize:\ *([0-9]+) ]] && echo "${BASH_REMATCH[1]}" || echo 1
}

# time_case FILE: best-of-RUNS seconds for CMD (set by client_cmd), verifying each copy.
time_case() {
    local file=$1 out=$DL/$1 best= i t0 t1 secs rc
    for ((i = 0; i < RUNS; i++)); do
        rm -f "$out"
        client_cmd "$client" "$bs" "$ws" "$file" "$out"
        rc=0
        t0=$(date +%s%N)
        "${PIN[@]}" "${CMD[@]}" >"$SCRATCH/client.log" 2>&1 || rc=$?
        t1=$(date +%s%N)
        if [[ $rc -ne 0 ]] || ! cmp -s "$TROOT/$file" "$out"; then
            cat "$SCRATCH/client.log" >&2
            die "$srv: download of $file with $client blksize=$bs windowsize=$ws failed (exit $rc) or differs"
        fi
        secs=$(calc "sprintf(\"%.3f\", ($t1 - $t0) / 1e9)")
        if [[ -z $best ]] || awk -v a="$secs" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$secs; fi
    done
    rm -f "$out"
    echo "$best"
}

PIN=()
[[ ${PIN_CPUS:-0} == 1 ]] && PIN=(taskset -c 1)
declare -A T
for srv in $SERVERS; do
    log "benchmarking $srv"
    "start_$srv"
    wait_udp 69
    for c in $CASES; do
        IFS=: read -r client bs ws <<<"$c"
        got_ws=$(granted_ws "$bs" "$ws")
        for mib in $SIZES; do
            secs=$(time_case "${mib}MiB.bin")
            T[$srv/$mib/$client/$bs/$ws]=$secs
            wsdesc=$got_ws
            [[ $got_ws == "$ws" ]] || wsdesc="$got_ws(requested $ws)"
            echo "tftp $srv file=${mib}MiB client=$client blksize=$bs windowsize=$wsdesc seconds=$secs"
        done
    done
    stop_server
done

# ratio NAME KEY_A KEY_B: print "tftp NAME=T[a]/T[b]" when both cases were run.
ratio() {
    local a=${T[$2]:-} b=${T[$3]:-}
    [[ -n $a && -n $b ]] || return 0
    echo "tftp $1=$(calc "sprintf(\"%.2f\", $a / $b)")"
}
echo
for other in tftp-hpa dnsmasq; do
    ratio "ratio paddock/$other" "paddock/64/atftp/1468/1" "$other/64/atftp/1468/1"
done
for other in tftp-hpa dnsmasq; do
    ratio "ratio-ws16 paddock/$other" "paddock/64/atftp/1468/16" "$other/64/atftp/1468/16"
done
