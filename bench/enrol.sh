#!/usr/bin/env bash
# Enrolment time: the same VM (SeaBIOS + iPXE, 1 vCPU, 512 MiB, one 1 GiB disk, TCG) booted
#   baseline  through a plain dnsmasq (DHCP + TFTP) + busybox ramdisk chain, power-on until
#             the ramdisk prints that it is up;
#   paddock   through Paddock, power-on until its inventory is stored (node finished).
# Both use the same Debian kernel (target/ramdisk/vmlinuz). Prints per-run times and
#   enrol baseline seconds=<s>
#   enrol paddock seconds=<s>
#   enrol ratio paddock/baseline=<R>
# Run as root (it builds what it needs, the ramdisk too):  bash bench/enrol.sh
# Env: RUNS=2 (best of)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ROOT=$PWD
RUNS=${RUNS:-2}
[[ $EUID -eq 0 ]] || { echo "run as root" >&2; exit 1; }
scripts/install-deps.sh --bench   # cpio, dnsmasq: the one list of packages
cargo build --release --locked -q -p paddock -p paddock-vm-tests
[[ -e target/ramdisk/vmlinuz && -e target/ramdisk/initrd.img ]] || scripts/build-ramdisk.sh

NS=pdk-enrol
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/paddock-enrol.XXXXXX")
cleanup() {
  set +e
  [[ -e /run/netns/$NS ]] && { ip netns pids $NS | xargs -r kill -9; ip netns del $NS; }
  rm -rf "$SCRATCH"
}
bench_guard enrol cleanup

# The baseline ramdisk: busybox, and an /init that reports and powers off.
mkdir -p "$SCRATCH/rd/bin" "$SCRATCH/rd/dev" "$SCRATCH/rd/proc" "$SCRATCH/tftp"
cp /bin/busybox "$SCRATCH/rd/bin/busybox"
cat >"$SCRATCH/rd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev
echo "BASELINE-RAMDISK-UP" > /dev/console
/bin/busybox poweroff -f
INIT
chmod +x "$SCRATCH/rd/init"
(cd "$SCRATCH/rd" && find . | cpio -o -H newc --quiet | gzip -1) >"$SCRATCH/tftp/baseline.img"
cp target/ramdisk/vmlinuz "$SCRATCH/tftp/vmlinuz"
cat >"$SCRATCH/tftp/boot.ipxe" <<'IPXE'
#!ipxe
kernel tftp://198.18.0.1/vmlinuz console=ttyS0 initrd=initrd
initrd --name initrd tftp://198.18.0.1/baseline.img
boot
IPXE

baseline_once() {
  ip netns add $NS
  ip -n $NS link set lo up
  ip -n $NS link add br0 type bridge
  ip -n $NS addr add 198.18.0.1/24 dev br0
  ip -n $NS link set br0 up
  ip -n $NS tuntap add dev tap0 mode tap
  ip -n $NS link set tap0 master br0 up
  ip netns exec $NS dnsmasq --no-daemon --port=0 --interface=br0 --bind-interfaces \
    --dhcp-range=198.18.0.100,198.18.0.200,1h --dhcp-userclass=set:ipxe,iPXE \
    --dhcp-boot=tag:ipxe,boot.ipxe --enable-tftp --tftp-root="$SCRATCH/tftp" \
    --dhcp-leasefile="$SCRATCH/leases" --log-facility="$SCRATCH/dnsmasq.log" 2>>"$SCRATCH/dnsmasq.err" &
  sleep 0.5
  : >"$SCRATCH/console.log"
  local t0=$(date +%s.%N)
  ip netns exec $NS qemu-system-x86_64 -accel tcg -m 512 -smp 1 -display none -monitor none -no-reboot \
    -serial "file:$SCRATCH/console.log" -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:e0:00:01,bootindex=1 &
  local qemu=$! deadline=$((SECONDS + 300))
  until grep -q BASELINE-RAMDISK-UP "$SCRATCH/console.log"; do
    ((SECONDS < deadline)) || { echo "baseline VM never came up" >&2; tail -20 "$SCRATCH/console.log" >&2; exit 1; }
    sleep 0.2
  done
  local t1=$(date +%s.%N)
  kill $qemu 2>/dev/null; wait $qemu 2>/dev/null || true
  ip netns pids $NS | xargs -r kill -9; ip netns del $NS
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }'
}

paddock_once() {
  PADDOCK_BIN=target/release/paddock PADDOCK_RAMDISK_DIR=target/ramdisk \
    timeout 600 target/release/paddock-lab --once --port 18080 2>/dev/null |
    awk '/enrolled state=finished/ { sub("seconds=", "", $4); print $4 }'
}

best() { sort -n | head -1; }
base_runs=() pad_runs=()
for ((i = 1; i <= RUNS; i++)); do
  b=$(baseline_once); echo "enrol baseline run=$i seconds=$b"; base_runs+=("$b")
  p=$(paddock_once); [[ -n $p ]] || { echo "paddock run failed" >&2; exit 1; }
  echo "enrol paddock run=$i seconds=$p"; pad_runs+=("$p")
done
B=$(printf '%s\n' "${base_runs[@]}" | best)
P=$(printf '%s\n' "${pad_runs[@]}" | best)
echo "enrol baseline seconds=$B"
echo "enrol paddock seconds=$P"
awk -v p="$P" -v b="$B" 'BEGIN { printf "enrol ratio paddock/baseline=%.2f\n", p / b }'
