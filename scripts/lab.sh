#!/usr/bin/env bash
# The lab, from a fresh Debian 12 machine, as root: builds Paddock and its discovery ramdisk,
# starts the appliance in a network namespace with a bridge, PXE-boots a VM (SeaBIOS + iPXE)
# through it, forwards the console to http://127.0.0.1:8080/ui and prints the node's state
# as it changes. Ctrl-C removes everything. Options: --vms N, --uefi, --http-boot (UEFI HTTP
# boot, TFTP off), --ipv6-only (UEFI PXE on an IPv6-only network), --secure-boot (OVMF enforcing Secure Boot with Microsoft's keys: shim →
# signed GRUB → signed kernel), --arch aarch64 (arm64 VMs under TCG: GRUB → the arm64
# ramdisk, inspection only), --port P, --once, --provision IMAGE.tar [--filter FILE]
# (install an image in the boot that inspects each VM;
# `--provision target/images/bootable.tar` is the bootable Debian test image, built here).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --locked -p paddock -p paddock-vm-tests
scripts/build-ramdisk.sh
if [[ " $* " == *" --arch aarch64 "* || " $* " == *" --arch arm64 "* ]]; then
  scripts/build-ramdisk.sh --arch aarch64
fi
if [[ " $* " == *" --provision "* ]]; then
  scripts/test-images.sh   # cached; the bootable test images and their filter
fi
PADDOCK_BIN=target/release/paddock PADDOCK_RAMDISK_DIR=target/ramdisk exec target/release/paddock-lab "$@"
