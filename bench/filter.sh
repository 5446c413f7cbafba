#!/usr/bin/env bash
# PXE filter: Paddock's nftables sets versus Ironic Inspector's iptables chain, in one run.
#   paddock   one `inet paddock` table, a 10,000-MAC deny set applied as one nft batch,
#             then one MAC added and removed (element add/delete);
#   iptables  Inspector's way: a chain with one `-m mac --mac-source X -j DROP` rule per MAC,
#             built in a temporary chain and swapped in (its exact command sequence); a
#             change of one MAC rebuilds the chain.
#   netlink   Paddock's membership path at scale (10,000 and 100,000 MACs): all added in one
#             netlink batch, every tenth moved to the allow set, the deny set flushed behind
#             Paddock's back and repaired by the reconcile path (read the whole table,
#             compare, send the difference), an idle reconcile (the periodic cost), all
#             removed.
# All in a network namespace this script creates. Prints
#   filter paddock ... / filter iptables ... / filter ratio paddock/iptables=<R> (10,000 MACs)
#   filter netlink macs=<N> add_all_ms=... move_ms=... remove_all_ms=... repair_ms=...
#                  reconcile_idle_ms=...
# Run as root (it builds what it needs):  bash bench/filter.sh
# Env: COUNT=10000, NETLINK_COUNTS="10000 100000"
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
COUNT=${COUNT:-10000}
NETLINK_COUNTS=${NETLINK_COUNTS:-10000 100000}
[[ $EUID -eq 0 ]] || { echo "run as root" >&2; exit 1; }
BIN=target/release/paddock-filter-bench
scripts/install-deps.sh --bench >&2   # nftables, iptables: the one list of packages
cargo build --release --locked -q -p paddock-firewall --bin paddock-filter-bench
NS=pdk-filter-bench
ip netns del $NS 2>/dev/null || true
ip netns add $NS
filter_cleanup() { ip netns del $NS 2>/dev/null || true; }
bench_guard filter filter_cleanup

out=$($BIN $NS "$COUNT")
echo "$out"
P=$(sed -E 's/.*full_ms=([0-9.]+).*/\1/' <<<"$out")

macs=$(awk -v n="$COUNT" 'BEGIN { for (i = 0; i < n; i++) printf "52:54:04:%02x:%02x:%02x\n", int(i / 65536) % 256, int(i / 256) % 256, i % 256 }')
ipt() { ip netns exec $NS iptables -w "$@"; }
inspector_sync() { # Inspector's sequence (pxe_filter/iptables.py), default blacklist mode
  ipt -D INPUT -i br-ctlplane -p udp --dport 67 -j pdk_temp 2>/dev/null || true
  ipt -F pdk_temp 2>/dev/null || true; ipt -X pdk_temp 2>/dev/null || true
  ipt -N pdk_temp
  while read -r m; do ipt -A pdk_temp -m mac --mac-source "$m" -j DROP; done <<<"$1"
  ipt -A pdk_temp -j ACCEPT
  ipt -I INPUT -i br-ctlplane -p udp --dport 67 -j pdk_temp
  ipt -D INPUT -i br-ctlplane -p udp --dport 67 -j pdk 2>/dev/null || true
  ipt -F pdk 2>/dev/null || true; ipt -X pdk 2>/dev/null || true
  ipt -E pdk_temp pdk
}
t0=$(date +%s.%N); inspector_sync "$macs"; t1=$(date +%s.%N)
rules=$(ip netns exec $NS iptables -S pdk | grep -c mac-source)
[[ $rules -eq $COUNT ]] || { echo "iptables chain has $rules rules, wanted $COUNT" >&2; exit 1; }
t2=$(date +%s.%N); inspector_sync "$(printf '%s\n52:54:05:00:00:01' "$macs")"; t3=$(date +%s.%N)
I=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) * 1000 }')
I1=$(awk -v a="$t2" -v b="$t3" 'BEGIN { printf "%.1f", (b - a) * 1000 }')
echo "filter iptables macs=$COUNT full_ms=$I add_one_ms=$I1 (rebuild)"
awk -v p="$P" -v i="$I" 'BEGIN { printf "filter ratio paddock/iptables=%.4f\n", p / i }'
for n in $NETLINK_COUNTS; do $BIN netlink $NS "$n"; done
