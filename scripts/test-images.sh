#!/usr/bin/env bash
# The real test images: a Debian minbase tree made by debootstrap, and a second one with a
# few packages changed and added (from the mirror apt uses; none is assumed). Output in target/images/:
#   minbase/        the tree (root-owned; devices kept)
#   minbase.tar     a tarball of it (numeric owners)
#   minbase2/ minbase2.tar   the second image
#   changed-bytes   bytes of regular files that differ or are new in minbase2 (truly changed)
# and the bootable images (bootable/, bootable2/, bootable.filter…: see below).
# Cached: a second run does nothing; the debootstrap root is cached in $PADDOCK_CACHE
# (default /var/cache/paddock) so fresh clones reuse it. Needs root (debootstrap, chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${IMAGES_OUT:-target/images}
[[ $EUID -eq 0 ]] || { echo "test-images.sh: run as root" >&2; exit 1; }
source scripts/debian.sh
mkdir -p "$OUT"
if [[ ! -s $OUT/minbase.tar ]]; then
  # The pristine minbase root (debootstrap from the mirror apt uses, cached across clones).
  base=$(minbase_tarball) || { echo "test-images.sh: no minbase root" >&2; exit 1; }
  rm -rf "$OUT/minbase" "$OUT/minbase.tmp"
  mkdir "$OUT/minbase.tmp"
  tar --numeric-owner -C "$OUT/minbase.tmp" -xpf "$base"
  mv "$OUT/minbase.tmp" "$OUT/minbase"
  cp "$base" "$OUT/minbase.tar.tmp"
  mv "$OUT/minbase.tar.tmp" "$OUT/minbase.tar"
fi
if [[ ! -s $OUT/minbase2.tar ]]; then
  rm -rf "$OUT/minbase2"
  cp -a "$OUT/minbase" "$OUT/minbase2"
  # Changed: a few packages added; their files and the dpkg/apt state they touch.
  mount --bind /proc "$OUT/minbase2/proc"
  trap 'umount "$OUT/minbase2/proc" 2>/dev/null || true' EXIT
  chroot "$OUT/minbase2" apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive chroot "$OUT/minbase2" apt-get install -y -qq --no-install-recommends \
    less netbase iproute2 >"$OUT/minbase2.log" 2>&1 || { tail -20 "$OUT/minbase2.log" >&2; exit 1; }
  chroot "$OUT/minbase2" apt-get clean
  rm -rf "$OUT/minbase2/var/lib/apt/lists/"*
  umount "$OUT/minbase2/proc"; trap - EXIT
  tar --numeric-owner -C "$OUT/minbase2" -cf "$OUT/minbase2.tar.tmp" .
  mv "$OUT/minbase2.tar.tmp" "$OUT/minbase2.tar"
fi
if [[ ! -s $OUT/changed-bytes ]]; then
  # Regular files in minbase2 whose bytes are not the bytes of the same path in minbase.
  (cd "$OUT/minbase2" && find . -xdev -type f -print0) | while IFS= read -r -d '' f; do
    if ! cmp -s "$OUT/minbase2/$f" "$OUT/minbase/$f" 2>/dev/null; then stat -c %s "$OUT/minbase2/$f"; fi
  done | awk '{ s += $1 } END { print s + 0 }' >"$OUT/changed-bytes"
fi
echo "test-images: $(du -sh "$OUT/minbase" | cut -f1) minbase, $(du -sh "$OUT/minbase2" | cut -f1) minbase2, changed bytes $(cat "$OUT/changed-bytes")" >&2

# ---------------------------------------------------------------------------------------------
# The bootable images: what the birther installs on a machine's disk and the VM
# scenarios boot. Output, beside the minbase images:
#   bootable/  bootable.tar      the image A (root-owned tree; its tarball, numeric owners)
#   bootable2/ bootable2.tar     the image B: A with about 10 % of its regular files new or changed
#   bootable.filter              the images' filter (Dominator syntax): what the birther writes on
#                                each machine and the dominator never creates, changes or deletes
#   bootable-changed-bytes       bytes of regular files that differ or are new in bootable2
#   bootable-stats               sizes, file counts and the share of files that differ
# Both trees hold exactly what the image server keeps of them: every path the filter matches is
# removed before the tarball is made (so `tar -x` of the tarball and a push by the dominator
# leave the same files).
#
# What A holds: Debian $SUITE `debootstrap --variant=minbase` (the cached root above) plus, from
# the same mirror and without recommends:
#   - linux-image-amd64 and its initramfs (initramfs-tools, MODULES=most: boots on any x86-64
#     machine; RESUME=none so the build host's swap is never baked in);
#   - GRUB for both firmware kinds, installed by the birther on the machine: grub-pc-bin
#     (i386-pc modules), grub-efi-amd64-bin (x86_64-efi modules), grub2-common (grub-install,
#     update-grub) and grub-common (grub-mkconfig, grub-probe). Not grub-pc / grub-efi-amd64:
#     their maintainer scripts install a boot loader on package upgrades, which on a machine the
#     dominator manages is the birther's job. efibootmgr is not needed: the birther installs
#     with --removable --no-nvram (\EFI\BOOT\BOOTX64.EFI, which every UEFI firmware boots);
#   - the signed chain for machines that enforce Secure Boot: shim-signed (shim, signed by the
#     UEFI CA) and grub-efi-amd64-signed (GRUB, signed by Debian); the birther installs them
#     with --uefi-secure-boot when the ramdisk booted under Secure Boot;
#   - systemd-sysv, udev, e2fsprogs, iproute2;
#   - networking by DHCP on every Ethernet interface: systemd-networkd (part of systemd) with
#     /etc/systemd/network/50-paddock-dhcp.network (`Name=en* eth*`, DHCP=yes, the MAC as DHCP
#     client identifier, as the ramdisk's udhcpc sends), and systemd-resolved for the DNS
#     servers DHCP hands out (networkd alone writes no resolv.conf; it pulls in dbus). Chosen
#     over ifupdown + isc-dhcp-client because one file matches every interface by name pattern,
#     whatever it is called on the machine. systemd-networkd-wait-online waits for any one
#     interface (--any), not all: a server's unplugged ports must not hold network-online.target;
#   - /etc/default/grub: kernel and GRUB on the serial console (ttyS0, 115200; tty0 too),
#     GRUB_TIMEOUT=1, no quiet (boot progress on the console), no os-prober, no recovery entry;
#   - /etc/fstab by label: LABEL=paddock-root on / (ext4), LABEL=PADDOCK-ESP on /boot/efi
#     (vfat, nofail: a machine without one still boots);
#   - root locked (no password, no ssh): nobody logs in; serial-getty@ttyS0 is enabled and shows a
#     login prompt on the serial console (the VM checks wait for it);
#   - lean: dpkg excludes docs (but copyright files), man and info pages, translations and the
#     kernel modules servers do not use (sound, media, wireless, bluetooth, staging, comedi) in
#     /etc/dpkg/dpkg.cfg.d/paddock-lean, so later packages stay lean too; apt lists and caches
#     cleaned; the apt timers (apt-daily, apt-daily-upgrade) and dpkg-db-backup.timer disabled:
#     they would write state the dominator then reverts;
#   - no machine identity: no /etc/hostname, no /etc/machine-id (/var/lib/dbus/machine-id is a
#     link to it), /etc/hosts names only localhost (resolved answers for the host name).
# Not in the image, on purpose: paddock-subd. The birther copies it from the ramdisk into
# /var/lib/paddock/ with its configuration and trust material, writes
# /etc/systemd/system/paddock-subd.service and its multi-user.target.wants link; the filter names
# these paths, so the dominator never deletes or changes them and subd's version follows the
# appliance, not the image. The birther also writes /etc/hostname and a fresh random
# /etc/machine-id, makes /boot/efi (the ESP's mount point) and runs grub-install (both firmware
# kinds, or the one found) and update-grub in the new root (scripts/check-bootable-image.sh does
# all of this the way the birther must).
#
# How B differs from A (deterministic for a given mirror, like minbase2): B is A as shipped plus
# the packages in BOOTABLE2_PACKAGES below, an operator's tools (from the same mirror, without
# recommends): their files and the dpkg, ld.so, alternatives and CA state they touch; nothing
# else changes. About 10 % of B's regular files are new or changed that way, but only about 3 %
# of its bytes (the kernel modules hold most bytes and stay as they are).
#
# Cached: the two tarballs are kept in $PADDOCK_CACHE under a key made from this recipe (the
# functions and lists below), so fresh clones reuse them and a changed recipe rebuilds them (a
# changed B alone keeps A); target/images/bootable.key and bootable2.key name the keys the trees
# here were made from. Downloaded packages are kept in $PADDOCK_CACHE/apt-archives (shared with
# scripts/fresh-check.sh).

BOOTABLE_PACKAGES=(linux-image-amd64 grub-pc-bin grub-efi-amd64-bin grub2-common grub-common
  shim-signed grub-efi-amd64-signed systemd-sysv udev e2fsprogs iproute2 systemd-resolved)
BOOTABLE2_PACKAGES=(less procps curl ca-certificates openssh-client lsof ethtool pciutils dmidecode
  bash-completion)

# The filter file: one start-anchored regular expression per line (`X(|/.*)$` is X and all
# below it, not Xfoo; `X/.*` is what is below X but not X itself). A directory the image must
# hold (a mount point such as /proc, /tmp) is filtered by its contents only, so a fresh install
# gets it; a path the image never holds (written or made on the machine) is filtered itself, so
# the dominator does not delete it.
bootable_filter() {
  cat <<'FILTER'
# Filter of Paddock's bootable test images (scripts/test-images.sh): paths the dominator never
# creates, changes or deletes on a machine, left out of the image when it is built. Dominator's
# syntax: one regular expression per line, anchored at the start only.
#
# Written by the birther on each machine:
/etc/hostname$
/etc/machine-id$
# paddock-subd: its binary, configuration and trust material, and its unit (enabled).
/var/lib/paddock(|/.*)$
/etc/paddock/subd(|/.*)$
/etc/systemd/system/paddock-subd\.service$
/etc/systemd/system/multi-user\.target\.wants/paddock-subd\.service$
# The boot loader: grub-install and update-grub on the machine (grub.cfg names its root's UUID);
# /boot/efi is the ESP's mount point, made by the birther.
/boot/grub(|/.*)$
/boot/efi(|/.*)$
# mkfs.ext4 makes it; e2fsck uses it.
/lost\+found(|/.*)$
# State the running system writes (no image holds it):
/var/lib/systemd/random-seed$
/var/lib/systemd/timers(|/.*)$
/var/lib/systemd/(coredump|pstore)/.*
/tmp/.*
/var/tmp/.*
/var/log/.*
/var/cache/.*
/var/mail/.*
/var/spool/.*
/home/.*
# Mount points of other file systems (the directories themselves stay in the image, so that a
# fresh install has them).
/run/.*
/proc/.*
/sys/.*
/dev/.*
FILTER
}

BOOT_MOUNTS=()
BOOT_TMP=()
boot_cleanup() {
  local rc=$? i d
  for ((i = ${#BOOT_MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${BOOT_MOUNTS[i]}" 2>/dev/null || umount -l "${BOOT_MOUNTS[i]}" 2>/dev/null || true
  done
  BOOT_MOUNTS=()
  for d in "${BOOT_TMP[@]}"; do
    if mounted_below "$d"; then
      echo "test-images.sh: something is still mounted below $d; leaving it in place" >&2
    else
      rm -rf --one-file-system "$d"
    fi
  done
  BOOT_TMP=()
  return "$rc"
}
# mounted_below DIR: true when a file system is mounted at DIR or below it. Never remove a
# build root through a mount (the .deb cache and /proc are mounted into it while packages install).
mounted_below() {
  local d
  d=$(realpath -m "$1")
  findmnt -rn -o TARGET | awk -v d="$d" '$0 == d || index($0, d "/") == 1 { f = 1 } END { exit !f }'
}
# in_root ROOT CMD...: runs CMD in the root with a clean environment.
in_root() {
  local r=$1
  shift
  chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
# apt_enter ROOT / apt_leave ROOT: what installing packages in the root needs, and only while it
# does: /proc, the shared .deb cache, the host's resolver and apt settings (proxies, validity
# checks; not its cache cleaners), and a policy-rc.d that keeps package scripts from starting
# daemons. apt_leave takes all of it away again.
apt_enter() {
  local r=$1 f
  mount -t proc proc "$r/proc"
  BOOT_MOUNTS+=("$r/proc")
  mkdir -p "$PADDOCK_CACHE/apt-archives/partial" "$r/var/cache/apt/archives"
  mount --bind "$PADDOCK_CACHE/apt-archives" "$r/var/cache/apt/archives"
  BOOT_MOUNTS+=("$r/var/cache/apt/archives")
  mkdir -p "$r/var/cache/debconf" "$r/var/log/apt" "$r/var/lib/apt/lists/partial"
  # A shipped image has an empty /dev (the filter): apt's gpgv needs /dev/null.
  [[ -c $r/dev/null ]] || { rm -f "$r/dev/null" && mknod -m 666 "$r/dev/null" c 1 3; }
  rm -f "$r/etc/resolv.conf"
  cp -L /etc/resolv.conf "$r/etc/resolv.conf"
  for f in /etc/apt/apt.conf.d/*; do
    grep -q 'Post-Invoke' "$f" 2>/dev/null || cp "$f" "$r/etc/apt/apt.conf.d/zz-paddock-build-${f##*/}"
  done
  printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
  chmod +x "$r/usr/sbin/policy-rc.d"
}
apt_leave() {
  local r=$1 i
  for ((i = ${#BOOT_MOUNTS[@]} - 1; i >= 0; i--)); do umount "${BOOT_MOUNTS[i]}"; done
  BOOT_MOUNTS=()
  rm -f "$r/usr/sbin/policy-rc.d" "$r"/etc/apt/apt.conf.d/zz-paddock-build-*
  rm -f "$r/etc/resolv.conf"
  ln -s ../run/systemd/resolve/stub-resolv.conf "$r/etc/resolv.conf"
  rm -rf "$r/var/lib/apt/lists/"*
}
# apt_install ROOT LOG PACKAGE...: installs from the mirror, without recommends.
apt_install() {
  local r=$1 log=$2
  shift 2
  if ! { in_root "$r" apt-get update -q && in_root "$r" apt-get install -y -q --no-install-recommends "$@"; } >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "test-images.sh: installing $* in the bootable image failed (log above, $log)" >&2
    return 1
  fi
}
# strip_filtered ROOT FILTER: removes every path the filter matches (with what is below it).
strip_filtered() {
  local r=$1 re p
  re=$(grep -v -e '^#' -e '^[[:space:]]*$' "$2" | sed 's/.*/^(&)/' | paste -sd'|')
  mounted_below "$r" && { echo "test-images.sh: $r has mounts; not stripping it" >&2; return 1; }
  (cd "$r" && find . -mindepth 1 -printf '/%P\n') | { grep -E "$re" || true; } |
    while IFS= read -r p; do rm -rf --one-file-system "${r:?}$p"; done
}

# bootable_recipe ROOT FILTER: turns a pristine minbase root into the image A.
bootable_recipe() {
  local r=$1
  mkdir -p "$r/etc/dpkg/dpkg.cfg.d" "$r/etc/initramfs-tools/conf.d" "$r/etc/default" \
    "$r/etc/systemd/network" "$r/etc/systemd/system/systemd-networkd-wait-online.service.d"
  cat >"$r/etc/dpkg/dpkg.cfg.d/paddock-lean" <<'LEAN'
# Paddock's bootable image is lean: no documentation (but the copyright files), manual pages or
# translations, and no kernel modules for what servers lack (sound, cameras, radios).
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /lib/modules/*/kernel/sound/*
path-exclude /lib/modules/*/kernel/drivers/media/*
path-exclude /lib/modules/*/kernel/drivers/net/wireless/*
path-exclude /lib/modules/*/kernel/net/wireless/*
path-exclude /lib/modules/*/kernel/net/mac80211/*
path-exclude /lib/modules/*/kernel/drivers/bluetooth/*
path-exclude /lib/modules/*/kernel/net/bluetooth/*
path-exclude /lib/modules/*/kernel/drivers/staging/*
path-exclude /lib/modules/*/kernel/drivers/comedi/*
LEAN
  # What dpkg now excludes, from the packages debootstrap installed.
  find "$r/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$r/usr/share/man/"* "$r/usr/share/info/"* "$r/usr/share/lintian/"*
  find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  echo RESUME=none >"$r/etc/initramfs-tools/conf.d/resume"
  # Before the kernel: the initramfs's fsck hook reads the root's type from it.
  cat >"$r/etc/fstab" <<'FSTAB'
# Paddock's bootable image: file systems by label (the birther labels them when it lays out the disk).
LABEL=paddock-root  /          ext4  errors=remount-ro   0  1
LABEL=PADDOCK-ESP   /boot/efi  vfat  umask=0077,nofail   0  1
FSTAB
  cat >"$r/etc/default/grub" <<'GRUB'
# Paddock's bootable image: GRUB and the kernel on the serial console (and the screen); the
# birther runs update-grub on the machine, which writes /boot/grub/grub.cfg from this.
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8"
GRUB_TERMINAL="serial console"
GRUB_SERIAL_COMMAND="serial --speed=115200 --unit=0 --word=8 --parity=no --stop=1"
GRUB_DISABLE_OS_PROBER=true
GRUB_DISABLE_RECOVERY=true
GRUB
  apt_enter "$r"
  apt_install "$r" "$OUT/bootable.log" "${BOOTABLE_PACKAGES[@]}" || return 1
  apt_leave "$r"
  cat >"$r/etc/systemd/network/50-paddock-dhcp.network" <<'NET'
# Paddock's bootable image: DHCP (v4 and v6) on every Ethernet interface, whatever its name.
[Match]
Name=en* eth*

[Network]
DHCP=yes

[DHCPv4]
# The MAC, as the ramdisk's DHCP client sends: the appliance knows the machine by it.
ClientIdentifier=mac
NET
  cat >"$r/etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf" <<'WAIT'
# Online when any interface is: a server's unplugged ports must not hold network-online.target.
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=60
WAIT
  cat >"$r/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
::1		localhost ip6-localhost ip6-loopback
ff02::1		ip6-allnodes
ff02::2		ip6-allrouters
HOSTS
  in_root "$r" systemctl enable -q systemd-networkd.service systemd-networkd-wait-online.service \
    systemd-resolved.service serial-getty@ttyS0.service
  in_root "$r" systemctl disable -q apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer
  in_root "$r" passwd -q -l root
  rm -f "$r/etc/machine-id" "$r/var/lib/dbus/machine-id"
  ln -s /etc/machine-id "$r/var/lib/dbus/machine-id"
}

# bootable2_recipe ROOT: turns a copy of A into B.
bootable2_recipe() {
  local r=$1
  apt_enter "$r"
  apt_install "$r" "$OUT/bootable2.log" "${BOOTABLE2_PACKAGES[@]}" || return 1
  apt_leave "$r"
}

# make_tarball ROOT FILTER TAR: strips what the filter matches, then writes TAR.
make_tarball() {
  strip_filtered "$1" "$2" || return 1
  tar --numeric-owner -C "$1" -cf "$3.tmp" . && mv "$3.tmp" "$3"
}

# unpack_image TAR NAME: target/images/NAME/ and NAME.tar from a cached tarball.
unpack_image() {
  rm -rf --one-file-system "$OUT/$2" "$OUT/$2.tmp" "$OUT/$2.tar"
  mkdir "$OUT/$2.tmp"
  tar --numeric-owner -C "$OUT/$2.tmp" -xpf "$1"
  mv "$OUT/$2.tmp" "$OUT/$2"
  cp "$1" "$OUT/$2.tar.tmp"
  mv "$OUT/$2.tar.tmp" "$OUT/$2.tar"
}

# build_bootable NAME FROM RECIPE DEST WHAT: RECIPE run on a root unpacked from the tarball
# FROM, filtered and packed as DEST in the cache (older recipes' NAME tarballs removed).
build_bootable() {
  local name=$1 from=$2 recipe=$3 dest=$4 what=$5 build
  build=$(mktemp -d "$PADDOCK_CACHE/$name.XXXXXX")
  BOOT_TMP+=("$build")
  mkdir "$build/root"
  tar --numeric-owner -C "$build/root" -xpf "$from"
  echo "test-images: building $what" >&2
  "$recipe" "$build/root" || exit 1
  make_tarball "$build/root" "$OUT/bootable.filter" "$build/root.tar" || exit 1
  rm -f "$PADDOCK_CACHE/debian-$SUITE-$name-"*.tar
  mv "$build/root.tar" "$dest"
  boot_cleanup
}

trap boot_cleanup EXIT
trap 'exit 130' INT TERM
if ! bootable_filter | cmp -s - "$OUT/bootable.filter"; then
  bootable_filter >"$OUT/bootable.filter.tmp"
  mv "$OUT/bootable.filter.tmp" "$OUT/bootable.filter"
fi
# The keys: A's from its recipe; B's from A's and its own (a changed B list keeps A).
key_a=$({
  echo "$SUITE ${BOOTABLE_PACKAGES[*]}"
  declare -f bootable_filter bootable_recipe in_root apt_enter apt_leave apt_install strip_filtered \
    make_tarball
} | sha256sum | cut -c1-16)
key_b=$({
  echo "$key_a ${BOOTABLE2_PACKAGES[*]}"
  declare -f bootable2_recipe
} | sha256sum | cut -c1-16)
a=$PADDOCK_CACHE/debian-$SUITE-bootable-$key_a.tar
b=$PADDOCK_CACHE/debian-$SUITE-bootable2-$key_b.tar
if [[ ! -s $OUT/bootable.tar || $(cat "$OUT/bootable.key" 2>/dev/null) != "$key_a" ]]; then
  rm -f "$OUT/bootable.key" "$OUT/bootable-changed-bytes" "$OUT/bootable-stats"
  if [[ ! -s $a ]]; then
    base=$(minbase_tarball) || { echo "test-images.sh: no minbase root" >&2; exit 1; }
    build_bootable bootable "$base" bootable_recipe "$a" \
      "the bootable image (kernel, GRUB, systemd from the mirror; minutes)"
  fi
  unpack_image "$a" bootable
  echo "$key_a" >"$OUT/bootable.key"
fi
if [[ ! -s $OUT/bootable2.tar || $(cat "$OUT/bootable2.key" 2>/dev/null) != "$key_b" ]]; then
  rm -f "$OUT/bootable2.key" "$OUT/bootable-changed-bytes" "$OUT/bootable-stats"
  if [[ ! -s $b ]]; then
    # From A as shipped (what the image server holds of it), not from A's build root.
    build_bootable bootable2 "$a" bootable2_recipe "$b" "the second bootable image"
  fi
  unpack_image "$b" bootable2
  echo "$key_b" >"$OUT/bootable2.key"
fi
if [[ ! -s $OUT/bootable-stats || ! -s $OUT/bootable-changed-bytes ]]; then
  # Regular files of B whose bytes are not those of the same path in A (changed or new).
  read -r files_a bytes_a < <(find "$OUT/bootable" -xdev -type f -printf '%s\n' | awk '{ s += $1 } END { print NR, s + 0 }')
  read -r files_b bytes_b < <(find "$OUT/bootable2" -xdev -type f -printf '%s\n' | awk '{ s += $1 } END { print NR, s + 0 }')
  read -r files_d bytes_d < <((cd "$OUT/bootable2" && find . -xdev -type f -print0) | while IFS= read -r -d '' f; do
    if ! cmp -s "$OUT/bootable2/$f" "$OUT/bootable/$f" 2>/dev/null; then stat -c %s "$OUT/bootable2/$f"; fi
  done | awk '{ s += $1 } END { print NR, s + 0 }')
  echo "$bytes_d" >"$OUT/bootable-changed-bytes"
  awk -v fa="$files_a" -v ba="$bytes_a" -v ta="$(stat -c %s "$OUT/bootable.tar")" \
    -v fb="$files_b" -v bb="$bytes_b" -v tb="$(stat -c %s "$OUT/bootable2.tar")" \
    -v fd="$files_d" -v bd="$bytes_d" 'BEGIN {
      m = 1048576
      printf "bootable: %d regular files, %.1f MiB (tar %.1f MiB); bootable2: %d regular files, %.1f MiB (tar %.1f MiB); ", fa, ba / m, ta / m, fb, bb / m, tb / m
      printf "differ or new in bootable2: %d files (%.1f %%), %.1f MiB (%.1f %% of its bytes)\n", fd, 100 * fd / fb, bd / m, 100 * bd / bb
    }' >"$OUT/bootable-stats"
fi
echo "test-images: $(cat "$OUT/bootable-stats")" >&2
