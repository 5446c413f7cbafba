#!/usr/bin/env bash
# Proves that the bootable test image (target/images/bootable.tar, from scripts/test-images.sh)
# boots with both firmware kinds, by doing on a disk file what the birther does on a machine's disk:
#   1. a sparse 3 GiB raw disk, GPT by sfdisk: a 1 MiB BIOS boot partition (GRUB's core.img for
#      BIOS), a 256 MiB EFI system partition (vfat, label PADDOCK-ESP), the rest the root (ext4,
#      label paddock-root): the labels the image's /etc/fstab mounts by;
#   2. attached with `losetup -P`; the root mounted and the tarball unpacked into it;
#   3. the machine's identity the image leaves out: /etc/hostname and a fresh random
#      /etc/machine-id; /boot/efi made (the ESP's mount point);
#   4. in a chroot of the new root, with /dev, /proc and /sys bound, the script install_script
#      writes below (the birther's steps, verbatim):
#        mount -t vfat <ESP> /boot/efi
#        /dev/disk/by-uuid/<root's UUID> → the root partition, when there is no udev to make it
#          (without it update-grub writes root=/dev/<name the installing kernel gave>, not UUID=)
#        grub-install --target=i386-pc <the whole disk>
#        grub-install --target=x86_64-efi --removable --efi-directory=/boot/efi --no-nvram
#        update-grub
#      (--removable: \EFI\BOOT\BOOTX64.EFI, which every UEFI firmware boots with no NVRAM entry;
#      --no-nvram: no efibootmgr, no efivarfs);
#   5. all unmounted and detached; then the disk is booted with no network (`-nic none`) by
#      `qemu-system-x86_64 -accel tcg -m 1024 -nographic`: once with SeaBIOS, once with OVMF
#      (OVMF_CODE_4M.fd and a copy of OVMF_VARS_4M.fd), each from the same pristine disk
#      (-snapshot). The serial console is watched for the kernel, systemd's first "Reached target"
#      and the login prompt (serial-getty on ttyS0); the time each took is printed:
#        check-bootable-image: bios kernel_s=… reached_target_s=… login_s=…
# When this host's kernel cannot do step 2 or 4 (no GPT partition scanning of loop devices, or
# no vfat: minimal CI and micro-VM kernels), the partitions are attached one by one with
# `losetup --offset --sizelimit` to make the file systems and unpack the image, and step 4 runs
# the same script inside a first boot of the disk itself (the image's own kernel and initramfs,
# booted directly by QEMU with init=<the script>), which powers off when done; the output says
# which way was taken ("install: chroot" or "install: vm").
#
# Usage: scripts/check-bootable-image.sh [bios|uefi|both]   (default both)
# Environment: IMAGE (default target/images/bootable.tar), BOOT_TIMEOUT (seconds per boot,
# default 900: TCG on a loaded 2-core machine is slow), INSTALL=chroot|vm (default: chroot when
# the kernel can), KEEP=1 (keep the disk and the console logs in target/images/check-bootable.*).
# Needs root (loop devices, mounts, chroot). Everything it mounts, attaches or starts is undone on
# exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $EUID -eq 0 ]] || { echo "check-bootable-image: run as root (loop devices, mounts, chroot)" >&2; exit 1; }
WHICH=${1:-both}
case $WHICH in bios | uefi | both) ;; *) echo "usage: $0 [bios|uefi|both]" >&2; exit 2 ;; esac
IMAGE=${IMAGE:-target/images/bootable.tar}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-900}
INSTALL=${INSTALL:-}
OVMF_CODE=/usr/share/OVMF/OVMF_CODE_4M.fd
OVMF_VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
log() { echo "check-bootable-image: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[[ -s $IMAGE ]] || die "$IMAGE is missing: run scripts/test-images.sh"
for t in sfdisk mkfs.ext4 mkfs.vfat losetup qemu-system-x86_64; do
  command -v "$t" >/dev/null || die "$t is missing: run scripts/install-deps.sh"
done
[[ $WHICH == bios ]] || [[ -s $OVMF_CODE && -s $OVMF_VARS ]] || die "$OVMF_CODE is missing: run scripts/install-deps.sh (ovmf)"
mkdir -p target/images
avail=$(df -Pk target/images | awk 'NR == 2 { print $4 }')
((avail > 4 * 1024 * 1024)) || die "less than 4 GiB free under target/ (the disk holds ~1 GiB of the 3 GiB it spans; the boots write more)"

WORK=$(mktemp -d "$PWD/target/images/check-bootable.XXXXXX")
DISK=$WORK/disk.raw
MNT=$WORK/root
LOOPS=()
MOUNTS=()
QEMU_PID=
UUID_LINK=
cleanup() {
  local rc=$? i
  if [[ -n $QEMU_PID ]]; then kill "$QEMU_PID" 2>/dev/null || true; wait "$QEMU_PID" 2>/dev/null || true; fi
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    if mountpoint -q "${MOUNTS[i]}"; then
      umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || true
    fi
  done
  [[ -n $UUID_LINK ]] && rm -f "$UUID_LINK"
  for i in "${LOOPS[@]}"; do losetup -d "$i" 2>/dev/null || log "could not detach $i"; done
  # Never remove through a mount (/dev, /proc and /sys are bound into the root while GRUB installs).
  if findmnt -rn -o TARGET | awk -v d="$WORK" '$0 == d || index($0, d "/") == 1 { f = 1 } END { exit !f }'; then
    log "something is still mounted below $WORK; leaving it in place"
  elif [[ ${KEEP:-0} == 1 ]]; then
    log "kept $WORK"
  else
    rm -rf --one-file-system "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
detach_all() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    if mountpoint -q "${MOUNTS[i]}"; then umount "${MOUNTS[i]}"; fi
  done
  MOUNTS=()
  for i in "${LOOPS[@]}"; do losetup -d "$i"; done
  LOOPS=()
}

# install_script: the birther's boot-loader steps, run as root in the new root (a chroot, or
# init of a first boot): install.sh DISK ESP ROOT.
install_script() {
  cat <<'SH'
#!/bin/sh
# Written by scripts/check-bootable-image.sh: the birther's boot-loader steps in the new root.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
disk=$1 esp=$2 root=$3 link=
fail() { echo "PADDOCK-INSTALL-FAILED: $*"; exit 1; }
set -x
mountpoint -q /boot/efi || mount -t vfat "$esp" /boot/efi || fail "mount the ESP $esp"
uuid=$(blkid -s UUID -o value "$root") && [ -n "$uuid" ] || fail "no UUID on $root"
if [ ! -e "/dev/disk/by-uuid/$uuid" ]; then
  mkdir -p /dev/disk/by-uuid && ln -s "$root" "/dev/disk/by-uuid/$uuid" && link=/dev/disk/by-uuid/$uuid
fi
grub-install --target=i386-pc "$disk" || fail "grub-install --target=i386-pc $disk"
grub-install --target=x86_64-efi --removable --efi-directory=/boot/efi --no-nvram ||
  fail "grub-install --target=x86_64-efi"
update-grub || fail update-grub
[ -z "$link" ] || rm -f "$link"
test -s /boot/efi/EFI/BOOT/BOOTX64.EFI || fail "no \\EFI\\BOOT\\BOOTX64.EFI"
grep -q "root=UUID=$uuid" /boot/grub/grub.cfg || fail "grub.cfg does not boot root=UUID=$uuid"
grep -q 'console=ttyS0' /boot/grub/grub.cfg || fail "grub.cfg has no console=ttyS0"
umount /boot/efi || fail "umount /boot/efi"
set +x
echo PADDOCK-INSTALL-OK
SH
}

# 1. The disk.
t0=$(date +%s.%N)
truncate -s 3G "$DISK"
sfdisk --quiet "$DISK" <<'EOF'
label: gpt
size=1MiB, type=21686148-6449-6E6F-744E-656564454649, name="bios-boot"
size=256MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC3B8, name="esp"
type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name="root"
EOF

# 2. Attached: the whole disk with its partitions, or (a kernel without GPT support) each
# partition on its own loop device.
LOOP=$(losetup -P -f --show "$DISK")
LOOPS+=("$LOOP")
for _ in $(seq 30); do [[ -b ${LOOP}p3 ]] && break; sleep 0.1; done
vfat() { grep -qw vfat /proc/filesystems || modprobe -q vfat 2>/dev/null; }
if [[ -b ${LOOP}p3 && $INSTALL != vm ]] && { [[ $INSTALL == chroot ]] || vfat; }; then
  INSTALL=chroot ESP=${LOOP}p2 ROOT=${LOOP}p3
else
  INSTALL=vm
  detach_all
  # part N: the byte offset and size of partition N.
  part() { sfdisk -d "$DISK" | sed -n "s|^$DISK$1 : start= *\([0-9]*\), size= *\([0-9]*\),.*|\1 \2|p"; }
  read -r start size < <(part 2)
  ESP=$(losetup -f --show --offset $((start * 512)) --sizelimit $((size * 512)) "$DISK")
  LOOPS+=("$ESP")
  read -r start size < <(part 3)
  ROOT=$(losetup -f --show --offset $((start * 512)) --sizelimit $((size * 512)) "$DISK")
  LOOPS+=("$ROOT")
fi
log "install: $INSTALL"
mkfs.vfat -F 32 -n PADDOCK-ESP "$ESP" >/dev/null
mkfs.ext4 -q -L paddock-root "$ROOT"
mkdir -p "$MNT"
mount "$ROOT" "$MNT"
MOUNTS+=("$MNT")
tar --numeric-owner -C "$MNT" -xpf "$IMAGE"

# 3. The machine's identity, the ESP's mount point, the install script.
echo paddock-check >"$MNT/etc/hostname"
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$MNT/etc/machine-id"
echo >>"$MNT/etc/machine-id"
chmod 0444 "$MNT/etc/machine-id"
mkdir -p "$MNT/boot/efi"
install_script >"$MNT/tmp/paddock-install.sh"
chmod 0755 "$MNT/tmp/paddock-install.sh"

# 4. GRUB.
if [[ $INSTALL == chroot ]]; then
  for d in dev proc sys; do mount --bind "/$d" "$MNT/$d" && MOUNTS+=("$MNT/$d"); done
  MOUNTS+=("$MNT/boot/efi") # mounted by the script
  uuid=$(blkid -s UUID -o value "$ROOT")
  [[ -e /dev/disk/by-uuid/$uuid ]] || UUID_LINK=/dev/disk/by-uuid/$uuid # the script's, if it fails
  chroot "$MNT" /usr/bin/env -i LC_ALL=C.UTF-8 HOME=/root /bin/sh /tmp/paddock-install.sh "$LOOP" "$ESP" "$ROOT" \
    >"$WORK/install.log" 2>&1 || true
  grep -q PADDOCK-INSTALL-OK "$WORK/install.log" || { tail -30 "$WORK/install.log" >&2; die "installing GRUB in the new root (log above)"; }
  rm -f "$MNT/tmp/paddock-install.sh"
  detach_all
else
  # The disk's own kernel and initramfs, booted directly, run the script as init and power off.
  kernel=$(cd "$MNT/boot" && ls vmlinuz-* | head -1)
  cp "$MNT/boot/$kernel" "$WORK/vmlinuz"
  cp "$MNT/boot/initrd.img-${kernel#vmlinuz-}" "$WORK/initrd.img"
  cat >"$MNT/tmp/paddock-init.sh" <<'SH'
#!/bin/sh
# init of the install boot (scripts/check-bootable-image.sh): the install script, then power off.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mountpoint -q /run || mount -t tmpfs tmpfs /run
# Run from /run, so that no file of the root is open when it is made read-only at the end.
if [ "$0" != /run/paddock-init.sh ]; then
  cp "$0" /run/paddock-init.sh && rm -f "$0" && exec /bin/sh /run/paddock-init.sh
fi
/bin/sh /tmp/paddock-install.sh /dev/vda /dev/vda2 /dev/vda3
rm -f /tmp/paddock-install.sh
sync
mount -o remount,ro / || echo "PADDOCK-INSTALL-FAILED: the root stays writable"
echo 1 >/proc/sys/kernel/sysrq
echo o >/proc/sysrq-trigger
sleep 30
SH
  chmod 0755 "$MNT/tmp/paddock-init.sh"
  detach_all
  ti=$(date +%s.%N)
  # In the background, so that a signal ends it at once (bash runs traps between commands only).
  qemu-system-x86_64 -accel tcg -machine q35 -m 1024 -smp 1 -nographic -nic none \
    -no-reboot -kernel "$WORK/vmlinuz" -initrd "$WORK/initrd.img" \
    -append "root=LABEL=paddock-root rw console=ttyS0,115200 init=/tmp/paddock-init.sh panic=-1" \
    -drive "file=$DISK,format=raw,if=virtio" </dev/null >"$WORK/install.log" 2>&1 &
  QEMU_PID=$!
  while kill -0 "$QEMU_PID" 2>/dev/null; do
    if awk -v e="$(since "$ti")" -v t="$BOOT_TIMEOUT" 'BEGIN { exit !(e > t) }'; then
      tail -40 "$WORK/install.log" | tr -d '\r' >&2
      die "the install boot did not power off within ${BOOT_TIMEOUT} s"
    fi
    sleep 1
  done
  wait "$QEMU_PID" || true
  QEMU_PID=
  grep -aq PADDOCK-INSTALL-OK "$WORK/install.log" && ! grep -aq PADDOCK-INSTALL-FAILED "$WORK/install.log" || {
    tail -40 "$WORK/install.log" | tr -d '\r' >&2
    die "installing GRUB in a first boot of the disk (console above)"
  }
  log "install boot took $(since "$ti") s"
fi
log "disk laid out and GRUB installed in $(since "$t0") s"

# boot FIRMWARE: boots the disk, watches the console, prints the times.
boot() {
  local fw=$1 con=$WORK/console-$1.log start el k="" r="" l="" fwargs=()
  if [[ $fw == uefi ]]; then
    cp "$OVMF_VARS" "$WORK/OVMF_VARS_4M.fd"
    fwargs=(-drive "if=pflash,format=raw,unit=0,readonly=on,file=$OVMF_CODE"
      -drive "if=pflash,format=raw,unit=1,file=$WORK/OVMF_VARS_4M.fd")
  fi
  : >"$con"
  start=$(date +%s.%N)
  qemu-system-x86_64 -accel tcg -machine q35 -m 1024 -smp 1 -nographic -nic none -snapshot \
    "${fwargs[@]}" -drive "file=$DISK,format=raw,if=virtio" </dev/null >"$con" 2>&1 &
  QEMU_PID=$!
  while :; do
    el=$(since "$start")
    [[ -z $k ]] && grep -aq 'Linux version' "$con" && k=$el
    [[ -z $r ]] && grep -aq 'Reached target' "$con" && r=$el
    [[ -z $l ]] && grep -aq 'login:' "$con" && l=$el && break
    kill -0 "$QEMU_PID" 2>/dev/null || { tail -40 "$con" | tr -d '\r' >&2; die "$fw: QEMU exited before the login prompt"; }
    if awk -v e="$el" -v t="$BOOT_TIMEOUT" 'BEGIN { exit !(e > t) }'; then
      tail -40 "$con" | tr -d '\r' >&2
      die "$fw: no login prompt on the serial console after ${BOOT_TIMEOUT} s (kernel ${k:-never}, Reached target ${r:-never})"
    fi
    sleep 1
  done
  kill "$QEMU_PID" 2>/dev/null || true
  wait "$QEMU_PID" 2>/dev/null || true
  QEMU_PID=
  if grep -aq 'FAILED\|Failed to start' "$con"; then
    log "$fw: failed units: $(grep -a 'FAILED\|Failed to start' "$con" | tr -d '\r' | head -5 | paste -sd';')"
  fi
  echo "check-bootable-image: $fw kernel_s=$k reached_target_s=${r:-none} login_s=$l"
}
[[ $WHICH == uefi ]] || boot bios
[[ $WHICH == bios ]] || boot uefi
