#!/usr/bin/env bash
# Boot storm: N machines (default 1,000) powering on at once, each doing what BIOS firmware
# and iPXE do — DHCP with PXE options, TFTP of the boot loader (undionly.kpxe, blksize 1468),
# DHCP again as iPXE, then HTTP of its script and of the discovery kernel and initrd the
# script names (the real ramdisk's files, built if missing) — against, in one run:
#   paddock            `paddock serve` (DHCP, TFTP, HTTP in one binary)
#   dnsmasq+nginx      dnsmasq (DHCP+TFTP, iPXE tag → a static script) with nginx serving
#                      the script, kernel and initrd
# and the TFTP part alone (every machine fetches undionly.kpxe) against tftp-hpa, dnsmasq and
# Paddock. The machines are simulated by bench/storm (paddock-storm: one process, DHCP through
# a relay socket, so a thousand machines need no interfaces of their own), in a namespace
# joined to the servers' by a veth pair. Prints per server and case:
#   storm <server> clients=N ok=K p50_s=… p99_s=… total_s=… duplicate_addresses=D
# (ok counts machines that booted through with an address no other machine was given;
# the bench fails when Paddock's is short, and notes a peer's)
# and `storm ratio paddock/best_peer=<R>` (full boot, total time) and
# `storm tftp ratio paddock/best_peer=<R>` (TFTP alone) and `storm p50 ratio
# paddock/best_peer=<R>` (the median machine's full boot), lower is better for Paddock.
#
# Run (as root): bash bench/storm.sh      Env: CLIENTS=1000 RUNS=1 PIN_CPUS=0
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLIENTS=${CLIENTS:-1000}
RUNS=${RUNS:-1}

bench_init storm
bench_deps
cargo build --release --locked -q -p paddock -p paddock-storm
[[ -s target/ramdisk/vmlinuz && -s target/ramdisk/initrd.img ]] || scripts/build-ramdisk.sh
PADDOCK_BIN=$ROOT/target/release/paddock
STORM=$ROOT/target/release/paddock-storm
netns_up

TROOT=$SCRATCH/tftp
WWW=$SCRATCH/www
mkdir -p "$TROOT" "$WWW"
cp /usr/lib/ipxe/undionly.kpxe "$TROOT/"
cp target/ramdisk/vmlinuz target/ramdisk/initrd.img "$WWW/"
chmod -R a+rX "$SCRATCH"
log "kernel $(stat -c %s "$WWW/vmlinuz") B, initrd $(stat -c %s "$WWW/initrd.img") B, boot loader $(stat -c %s "$TROOT/undionly.kpxe") B; $CLIENTS machines"

client() { # client LABEL ARGS...: one storm from the client namespace
    local label=$1; shift
    local pin=()
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 1)
    # A storm in which some machine failed still prints its line (and is judged at the end);
    # one that printed no line at all crashed, and fails the bench now.
    local out
    out=$("${pin[@]}" ip netns exec "$CLI_NS" "$STORM" --label "$label" --clients "$CLIENTS" \
        --relay "$CLI_IP" --server "$SRV_IP" "$@") || true
    grep -q "^storm $label clients=" <<<"$out" || die "paddock-storm printed no result for $label"
    echo "$out" | tee -a "$SCRATCH/results"
}

start_paddock() { # start_paddock [keep]: keep = the store of the previous start
    [[ ${1:-} == keep ]] || rm -rf "$SCRATCH/paddock-data"
    paddock_config "$SCRATCH/paddock.toml" true "[tftp]
listen = [\"$SRV_IP:69\"]
root = \"$TROOT\"
[boot.discovery]
kernel = \"http://$SRV_IP:8080/boot/assets/vmlinuz\"
initrd = \"http://$SRV_IP:8080/boot/assets/initrd.img\"
cmdline = \"console=ttyS0\"" "assets_dir = \"$WWW\"
# A thousand machines from one namespace share one address: on a real network each has its own.
max_connections_per_source = 0"
    start_server paddock env PADDOCK_LOG="${PADDOCK_LOG:-warn}" PADDOCK_INSECURE=true "$PADDOCK_BIN" serve --config "$SCRATCH/paddock.toml"
    wait_udp 69
}
# DHCP (PXE, then iPXE's script URL) and TFTP. --no-ping: dnsmasq would otherwise ping each
# address before offering it (Paddock does not), which here only adds waiting.
start_dnsmasq() {
    printf '#!ipxe\nkernel http://%s:8080/vmlinuz initrd=initrd console=ttyS0\ninitrd --name initrd http://%s:8080/initrd.img\nboot\n' \
        "$SRV_IP" "$SRV_IP" >"$WWW/boot.ipxe"
    start_server dnsmasq dnsmasq --no-daemon --port=0 --no-resolv --no-hosts --user=root \
        --listen-address="$SRV_IP" --bind-interfaces --log-facility=- --quiet-dhcp --quiet-tftp --no-ping \
        --dhcp-range=198.18.1.0,198.19.255.254,255.254.0.0,1h --dhcp-authoritative \
        --dhcp-lease-max=200000 --dhcp-leasefile="$SCRATCH/dnsmasq.leases" \
        --dhcp-userclass=set:ipxe,iPXE --dhcp-boot=tag:ipxe,"http://$SRV_IP:8080/boot.ipxe" \
        --dhcp-boot=tag:!ipxe,undionly.kpxe \
        --enable-tftp --tftp-root="$TROOT" --tftp-max=5000
    wait_udp 69
}
NGINX_PID=
start_nginx() { # the static HTTP server beside dnsmasq
    cat >"$SCRATCH/nginx.conf" <<NGINX
worker_processes auto;
pid $SCRATCH/nginx.pid;
error_log $SCRATCH/nginx-error.log;
daemon off;
events { worker_connections 8192; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    server { listen $SRV_IP:8080; root $WWW; }
}
NGINX
    local pin=()
    [[ ${PIN_CPUS:-0} == 1 ]] && pin=(taskset -c 0) # where the servers run
    "${pin[@]}" ip netns exec "$SRV_NS" nginx -c "$SCRATCH/nginx.conf" >"$SCRATCH/nginx.log" 2>&1 &
    NGINX_PID=$!
    sleep 1
}
stop_nginx() { [[ -n $NGINX_PID ]] && { kill "$NGINX_PID" 2>/dev/null; wait "$NGINX_PID" 2>/dev/null || true; NGINX_PID=; }; return 0; }
start_tftp-hpa() {
    start_server tftp-hpa in.tftpd --foreground --address "$SRV_IP:69" --secure "$TROOT"
    wait_udp 69
}

best() { # best LABEL FIELD: the lowest FIELD of LABEL's result lines
    awk -v l="$1" -v f="$2" '$2 == l { for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == f && (b == "" || kv[2] < b)) b = kv[2] } } END { print b }' "$SCRATCH/results"
}

for ((run = 0; run < RUNS; run++)); do
    start_paddock
    client paddock --mac-prefix $((run * 4))
    client paddock-tftp --tftp-only undionly.kpxe
    # No lease lost: after a restart, the store holds one bound lease per simulated machine.
    stop_server
    start_paddock keep
    leases=$(ip netns exec "$CLI_NS" curl -sf --retry 20 --retry-connrefused --retry-delay 1 \
        "http://$SRV_IP:8080/api/v1/leases" | python3 -c '
import json, sys
mine = {l["ip"] for l in json.load(sys.stdin) if l["mac"].startswith(sys.argv[1])}
print(len(mine))' "52:54:$(printf %02x $((run * 4))):5c")
    echo "storm paddock leases_after_restart=$leases (of $CLIENTS machines)" | tee -a "$SCRATCH/results"
    [[ $leases == "$CLIENTS" ]] || die "Paddock kept $leases leases of $CLIENTS"
    stop_server
    start_dnsmasq; start_nginx
    client dnsmasq+nginx --mac-prefix $((run * 4 + 1))
    client dnsmasq-tftp --tftp-only undionly.kpxe
    stop_nginx; stop_server
    start_tftp-hpa
    client tftp-hpa --tftp-only undionly.kpxe
    stop_server
done

p=$(best paddock total_s); d=$(best dnsmasq+nginx total_s)
pt=$(best paddock-tftp total_s); dt=$(best dnsmasq-tftp total_s); ht=$(best tftp-hpa total_s)
# The median machine's boot, too: a server that only wins on the peer's tail is not faster.
pm=$(best paddock p50_s); dm=$(best dnsmasq+nginx p50_s)
for v in "$p" "$d" "$pt" "$dt" "$ht" "$pm" "$dm"; do
    [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "a result is missing: $(cat "$SCRATCH/results")"
done
bt=$(awk -v a="$dt" -v b="$ht" 'BEGIN { print (a < b ? a : b) }')
awk -v p="$p" -v d="$d" 'BEGIN { printf "storm ratio paddock/best_peer=%.2f\n", p / d }'
awk -v p="$pm" -v d="$dm" 'BEGIN { printf "storm p50 ratio paddock/best_peer=%.2f\n", p / d }'
awk -v p="$pt" -v b="$bt" 'BEGIN { printf "storm tftp ratio paddock/best_peer=%.2f\n", p / b }'
# A run in which Paddock did not serve some machine (ok < clients) fails here. A peer that
# did not is said so: its times count only the machines it served.
awk '$1 == "storm" && $3 ~ /^clients=/ { split($3, c, "="); split($4, k, "="); if (k[2] != c[2]) print $2 }' "$SCRATCH/results" |
    sort -u | while read -r who; do
        echo "storm note: $who did not serve every machine (see ok= above)"
    done
awk '$1 == "storm" && $2 ~ /^paddock/ && $3 ~ /^clients=/ { split($3, c, "="); split($4, k, "="); if (k[2] != c[2]) bad = 1 } END { exit bad }' "$SCRATCH/results" \
    || die "Paddock did not serve every machine (ok < clients above)"
