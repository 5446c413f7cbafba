#!/usr/bin/env bash
# Proves scripts/install-deps.sh on a machine that holds nothing: unpacks a pristine Debian 12
# minbase root (debootstrap from the mirror apt uses, cached as a tarball in $PADDOCK_CACHE,
# default /var/cache/paddock), runs scripts/install-deps.sh --bench in it, then proves there
# that every prerequisite of the build, the tests, the lab and the benches works: each tool
# starts, protoc compiles a proto that imports google/protobuf/descriptor.proto, gcc links a
# static binary, the firmware files the VMs boot exist. A failure names the tool, who uses it,
# and the package scripts/install-deps.sh must install. Downloaded .deb files are cached too,
# so a later run takes a minute or two. Needs root (chroot). Options: --keep (leave the root).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID -eq 0 ]] || { echo "fresh-check: run as root (chroot)" >&2; exit 1; }
KEEP=0
[[ ${1:-} == --keep ]] && KEEP=1
source scripts/debian.sh

t0=$(date +%s)
base=$(minbase_tarball) || { echo "fresh-check: could not make the pristine root" >&2; exit 1; }
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/paddock-fresh.XXXXXX")
mounts=()
cleanup() {
  local rc=$? m i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  # Never remove through a mount that is still there (the .deb cache is a bind mount, and
  # --one-file-system cannot tell a bind mount of the same file system).
  for m in "${mounts[@]}"; do
    if mountpoint -q "$m"; then
      echo "fresh-check: $m is still mounted; leaving $ROOT in place" >&2
      KEEP=1
    fi
  done
  if [[ $KEEP == 1 ]]; then echo "fresh-check: root kept in $ROOT" >&2; else rm -rf --one-file-system "$ROOT"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bind() { mkdir -p "$ROOT$2"; mount --bind "$1" "$ROOT$2"; mounts+=("$ROOT$2"); }

tar --numeric-owner -C "$ROOT" -xpf "$base"
# One source: the Debian mirror apt uses here (the host's other repositories would need keys
# the root does not have). The host's apt settings (proxies, validity checks), not its cache
# cleaner, so that the .deb files land in the cache below; its resolver for the mirror's name.
mirror=$(apt_mirror) || exit 1
rm -f "$ROOT/etc/apt/sources.list.d/"*
echo "deb $mirror $SUITE main" >"$ROOT/etc/apt/sources.list"
for f in /etc/apt/apt.conf.d/*; do
  grep -q 'Post-Invoke' "$f" 2>/dev/null || cp "$f" "$ROOT/etc/apt/apt.conf.d/"
done
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
mkdir -p "$PADDOCK_CACHE/apt-archives/partial"
bind "$PADDOCK_CACHE/apt-archives" /var/cache/apt/archives
mount -t proc proc "$ROOT/proc"
mounts+=("$ROOT/proc")
mkdir -p "$ROOT/paddock"
cp scripts/install-deps.sh "$ROOT/paddock/"

echo "fresh-check: installing with scripts/install-deps.sh --bench in a pristine $SUITE root" >&2
if ! chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  bash /paddock/install-deps.sh --bench >"$ROOT/paddock/install.log" 2>&1; then
  tail -30 "$ROOT/paddock/install.log" >&2
  echo "fresh-check: FAILED: scripts/install-deps.sh --bench failed in a fresh root (log above)" >&2
  exit 1
fi

# Each check: package | who uses it | a command that must succeed in the root.
checks=(
  "iproute2|every network test (namespaces, veth, bridges)|ip -V"
  "procps|tests that stop processes (/usr/bin/kill, not the shell's)|/usr/bin/kill -l"
  "curl|HTTP tests|curl --version"
  "ca-certificates|cargo fetching from crates.io|test -s /etc/ssl/certs/ca-certificates.crt"
  "python3|the raw-socket DHCP client test|python3 --version"
  "python3-venv|the OpenStack CLI compatibility test (a venv)|python3 -m venv /tmp/venv-check"
  "busybox-static|udhcpc in the PXE tests; the ramdisk's tools|/bin/busybox udhcpc --help"
  "isc-dhcp-client|dhclient lease and renewal tests|dhclient --version"
  "isc-dhcp-relay|relayed DHCP (option 82) tests|dhcrelay --version"
  "atftp|TFTP tests and the boot-storm bench|atftp --help"
  "tftp-hpa|TFTP tests|tftp -V"
  "qemu-system-x86|VM scenarios and the lab|qemu-system-x86_64 --version"
  "ipxe-qemu|QEMU's iPXE option ROM (VM scenarios)|test -s /usr/lib/ipxe/qemu/efi-virtio.rom"
  "ipxe|the TFTP root (undionly.kpxe, snponly.efi)|test -s /usr/lib/ipxe/undionly.kpxe -a -s /usr/lib/ipxe/snponly.efi"
  "ovmf|UEFI VM scenarios, Secure Boot with Microsoft's keys|test -s /usr/share/OVMF/OVMF_CODE_4M.fd -a -s /usr/share/OVMF/OVMF_VARS_4M.fd -a -s /usr/share/OVMF/OVMF_VARS_4M.ms.fd"
  "shim-signed|the Secure Boot chain's shim|test -s /usr/lib/shim/shimx64.efi.signed"
  "grub-efi-amd64-signed|the Secure Boot chain's network GRUB|test -s /usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed"
  "gcc-aarch64-linux-gnu|the aarch64 agent's linker and ring's C (build-ramdisk.sh --arch aarch64)|aarch64-linux-gnu-gcc --version"
  "libc6-dev-arm64-cross|the static aarch64 agent (glibc for aarch64)|test -s /usr/aarch64-linux-gnu/lib/libc.a"
  "qemu-system-arm|the arm64 VM scenario and lab (qemu-system-aarch64)|qemu-system-aarch64 --version"
  "qemu-efi-aarch64|the arm64 VMs' UEFI (AAVMF)|test -s /usr/share/AAVMF/AAVMF_CODE.fd -a -s /usr/share/AAVMF/AAVMF_VARS.fd"
  "socat|the lab's console forwarder|socat -V"
  "lldpd|the LLDP switch of the VM scenarios|lldpd -v"
  "nftables|the PXE filter|nft --version"
  "debootstrap|the Debian test images|debootstrap --version"
  "etcd-server|etcd conformance and HA tests|etcd --version"
  "etcd-client|the HA lab's etcdctl|etcdctl version"
  "protobuf-compiler|etcd-client's build script (protoc)|protoc --version"
  "libprotobuf-dev|etcd-client's protos import google/protobuf/descriptor.proto|protoc_check"
  "gcc|bundled SQLite and zstd (cc)|gcc --version"
  "libc6-dev|the static glibc ramdisk agent|static_c_check"
  "apt|the ramdisk builder's kernel download|apt-cache --version"
  "dpkg|the ramdisk builder's kernel extraction|dpkg-deb --version"
  "fdisk|the birth ramdisk's partitioning (sfdisk, copied into the initramfs)|sfdisk --version"
  "util-linux|the birth ramdisk's wipefs, blkid, blkdiscard|wipefs --version && blkid --version && blkdiscard --version"
  "e2fsprogs|the birth ramdisk's root file system (mkfs.ext4)|mkfs.ext4 -V"
  "dosfstools|the birth ramdisk's EFI system partition (mkfs.fat)|mkfs.fat --help"
  "kea-dhcp4-server|bench/dhcp.sh (the Kea peer)|kea-dhcp4 -V"
  "kea-dhcp6-server|bench/dhcp.sh (the Kea DHCPv6 peer)|kea-dhcp6 -V"
  "kea-admin|bench/dhcp.sh (perfdhcp)|perfdhcp -v"
  "dnsmasq-base|bench/dhcp.sh, tftp.sh, enrol.sh (the dnsmasq peer)|dnsmasq --version"
  "tftpd-hpa|bench/tftp.sh (the tftp-hpa peer)|in.tftpd -V"
  "iptables|bench/filter.sh (Inspector's iptables way)|iptables --version"
  "cpio|bench/enrol.sh (the baseline ramdisk)|cpio --version"
  "nginx-light|bench/storm.sh (the static HTTP server beside dnsmasq)|nginx -v"
  "libvirt-daemon-system|the BMC harness (libvirtd, virtlogd started by hand)|libvirtd --version && virtlogd --version"
  "libvirt-clients|the BMC harness (virsh)|virsh --version"
  "python3-libvirt|sushy-tools and virtualbmc in the BMC harness's venv (system site packages)|python3 -c 'import libvirt'"
  "libvirt-dev|libvirt-python if pip builds it (the BMC harness's venv)|test -s /usr/include/libvirt/libvirt.h"
  "pkg-config|libvirt-python if pip builds it (the BMC harness's venv)|pkg-config --exists libvirt"
  "qemu-utils|the BMC harness's VM disk (qemu-img)|qemu-img --version"
  "ipmitool|the IPMI power driver and its tests|ipmitool -V"
  "openssl|the BMC harness's test CA and HTTPS certificate|openssl version"
  "chromium|the console's browser test (appliance/tests/console_browser.rs)|/usr/lib/chromium/chromium --headless=new --no-sandbox --version"
  "chromium-driver|the console's browser test (chromedriver, WebDriver)|chromedriver --version"
  "binutils|the Debian package's stripped binaries (scripts/build-deb.sh)|strip --version"
  "dpkg-dev|the Debian package's Depends and version (scripts/build-deb.sh: dpkg-shlibdeps, dpkg-parsechangelog)|dpkg-shlibdeps --version && dpkg-parsechangelog --version"
  "lintian|the Debian package's lint (scripts/check-deb.sh)|lintian --version"
  "systemd|the Debian package's unit checks (scripts/check-deb.sh: systemd-analyze verify, security)|systemd-analyze --version"
)
cat >"$ROOT/paddock/check.sh" <<'EOF'
set -u
protoc_check() {
  mkdir -p /tmp/protoc && cd /tmp/protoc &&
    printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\nmessage M { google.protobuf.FileDescriptorProto f = 1; }\n' >m.proto &&
    protoc --include_imports --descriptor_set_out=/tmp/protoc/m.pb m.proto && test -s /tmp/protoc/m.pb
}
static_c_check() {
  mkdir -p /tmp/cc && printf '#include <stdio.h>\nint main(void){puts("ok");return 0;}\n' >/tmp/cc/m.c &&
    gcc -static -o /tmp/cc/m /tmp/cc/m.c && test "$(/tmp/cc/m)" = ok
}
eval "$1"
EOF
failed=0
for c in "${checks[@]}"; do
  IFS='|' read -r pkg who cmd <<<"$c"
  if ! out=$(chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    bash /paddock/check.sh "$cmd" 2>&1); then
    echo "fresh-check: FAILED: \`$cmd\` in a fresh $SUITE root after scripts/install-deps.sh --bench:" \
      "$who needs package '$pkg'; name it in scripts/install-deps.sh" >&2
    [[ -n $out ]] && sed 's/^/    /' <<<"${out:0:600}" >&2
    failed=$((failed + 1))
  fi
done
if ((failed > 0)); then
  echo "fresh-check: $failed of ${#checks[@]} prerequisites missing" >&2
  exit 1
fi
echo "fresh-check: ${#checks[@]} prerequisites proven in a fresh $SUITE root in $(($(date +%s) - t0)) s"
