#!/usr/bin/env bash
# Installs the Debian packages Paddock's tests and lab (and, with --bench, its benchmarks) need.
# Idempotent: does nothing when everything is present. Must run as root.
set -euo pipefail

# Every Debian package the build, the tests, the lab and (with --bench) the benchmarks use,
# named here and installed without recommends: nothing may rely on what a machine happens to
# hold. scripts/fresh-check.sh proves the list in a pristine Debian 12 root.
packages=(
  ca-certificates curl  # crates.io over HTTPS for cargo; curl: the HTTP client of the tests
  gcc libc6-dev    # C builds of bundled SQLite and zstd; the static (glibc) ramdisk agent
  protobuf-compiler libprotobuf-dev  # protoc and the well-known .proto files etcd-client imports
  iproute2 procps  # ip: namespaces, veth, bridges, taps; kill
  python3 python3-venv  # a raw-socket test client; the OpenStack CLI in a venv
  busybox-static   # udhcpc: the DHCP client of the PXE tests; the ramdisk's shell tools
  fdisk util-linux # the ramdisk's birth/clean tools: sfdisk; wipefs, blkid, blkdiscard
  e2fsprogs dosfstools  # the ramdisk's mkfs.ext4 (root) and mkfs.fat (EFI system partition)
  isc-dhcp-client  # dhclient: lease and renewal
  isc-dhcp-relay   # dhcrelay: relayed requests with option 82
  atftp tftp-hpa   # TFTP clients
  qemu-system-x86 ipxe-qemu  # VMs with SeaBIOS and QEMU's iPXE option ROMs
  ipxe ovmf        # undionly.kpxe/snponly.efi for the TFTP root; UEFI firmware (also with Secure Boot)
  shim-signed grub-efi-amd64-signed  # the signed chain for Secure Boot machines: shimx64.efi.signed, grubnetx64.efi.signed
  socat            # the lab's console forwarder
  nftables         # the PXE filter
  debootstrap      # the Debian minbase test images and the fresh-root check
  fdisk dosfstools # sfdisk, mkfs.vfat: scripts/check-bootable-image.sh lays out a disk as the birther does
  etcd-server etcd-client  # the etcd backend's conformance tests and the HA scenarios
  libvirt-daemon-system libvirt-clients  # the BMC harness: libvirtd, virtlogd, virsh (scripts/bmc-harness.sh)
  python3-libvirt libvirt-dev pkg-config  # sushy-tools and virtualbmc in a --system-site-packages venv
  qemu-utils       # qemu-img: the BMC harness's VM disk
  ipmitool         # the IPMI power driver (paddock-power) and its tests
  openssl          # the BMC harness's test CA and HTTPS certificate
  chromium chromium-driver  # the console's browser test: headless Chromium through chromedriver (WebDriver)
  binutils dpkg-dev # the Debian package (scripts/build-deb.sh): strip; dpkg-shlibdeps, dpkg-parsechangelog
  lintian systemd  # its checks (scripts/check-deb.sh): lintian; systemd-analyze verify and security
  bind9-dnsutils   # dig: the DNS server's real client in its tests
  bind9            # named: a real secondary of the DNS server's zone (NOTIFY, IXFR) in its tests
  lldpd            # a switch that speaks LLDP on the lab's bridge, for the agent to hear
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross  # the static aarch64 agent (linker, glibc; ring's C)
  qemu-system-arm qemu-efi-aarch64  # arm64 VMs under TCG with UEFI (AAVMF)
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(
    kea-dhcp4-server kea-dhcp6-server kea-admin  # Kea (v4, v6) and perfdhcp (bench/dhcp.sh)
    dnsmasq-base     # DHCP+TFTP peer (bench/dhcp.sh, tftp.sh, enrol.sh)
    tftpd-hpa        # TFTP peer (bench/tftp.sh)
    iptables         # Inspector's PXE filter (bench/filter.sh)
    cpio             # the baseline ramdisk (bench/enrol.sh)
    nginx-light      # the static HTTP server: beside dnsmasq (bench/storm.sh), the fleet peer (bench/fleet.sh)
    nsd knot dnsperf # authoritative DNS peers (BIND's named is in the base list) and the load generator (bench/dns.sh)
  )
fi

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} == 0 )); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages (${missing[*]}); run as root" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
# Some of these packages start a daemon on install (tftpd-hpa, isc-dhcp-relay). Paddock's tests
# start what they need in their own namespaces, so keep the package scripts from starting them.
created_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
trap '[[ $created_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
