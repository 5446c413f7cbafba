#!/usr/bin/env bash
# Provisioning: Paddock's install of an image against streaming its tarball onto the disk.
# The same VM (TCG, 2 vCPUs, 1 GiB, one 4 GiB disk) and the same discovery ramdisk, in one
# run (vm-tests/src/bin/paddock-provision-bench.rs says exactly what each clock covers):
#   baseline  the ramdisk lays the disk out and formats it as a birth does, then busybox
#             `wget -O- URL | tar -x` (A's tarball from the appliance) onto the new root;
#   paddock   PXE boot, inspection, and the birth of the same image in the same boot: subd
#             on the new root, the dominator pushes the image (layout to "synced");
#   reimage   the installed VM re-imaged to B (~10 % of its files changed): the kept root is
#             the object cache, and only the rest crosses the network.
# Prints
#   provision install tls=on install_s=<s> baseline_s=<s> ratio=<r>   (goal ratio <= 0.9)
#   provision reimage fetched_share=<f>                                (goal <= 0.12)
#   provision install tls=off …       (the same install by an insecure appliance)
# Run as root (it builds what it needs, the ramdisk and the test images too):
#   bash bench/provision.sh [--uefi]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_guard provision
[[ $EUID -eq 0 ]] || { echo "run as root" >&2; exit 1; }
scripts/install-deps.sh --bench
cargo build --release --locked -q -p paddock -p paddock-vm-tests
scripts/build-ramdisk.sh >/dev/null
scripts/test-images.sh >/dev/null
PADDOCK_BIN=target/release/paddock PADDOCK_RAMDISK_DIR=target/ramdisk \
  target/release/paddock-provision-bench "$@"
