#!/usr/bin/env bash
# Builds Paddock's Debian 12 (bookworm) package into target/debian/paddock_<version>_amd64.deb
# from a staging tree (target/debian/paddock), with dpkg-deb alone: no cargo-deb, no
# debhelper, so that what goes in is what packaging/debian/ and this script say. In it:
#   /usr/bin/paddock                      the appliance and CLI (stripped)
#   /usr/lib/paddock/bin/                 the static paddock-subd and fs2objectcache the
#                                         ramdisk installs on machines (stripped)
#   /usr/lib/paddock/ramdisk/             the x86-64 discovery ramdisk: vmlinuz, initrd.img
#   /lib/systemd/system/paddock.service   the hardened unit (bookworm's debhelper puts units
#                                         under /lib, not /usr/lib)
#   /etc/paddock/paddock.toml             a conffile that serves nothing until `paddock init`
#   /usr/share/doc/paddock/               copyright, changelog.Debian.gz, README.md.gz,
#                                         api.md.gz, examples/ (a role spec and its hooks)
#   /usr/share/lintian/overrides/paddock  the two tags that do not apply, with the reason
# and the maintainer scripts of packaging/debian/. The Debian revision, the maintainer and
# every file's time (SOURCE_DATE_EPOCH: the same inputs give the same bytes) come from
# packaging/debian/changelog, whose newest entry must be for the crate's version.
#
# By default it builds what it packages: `cargo build --release --locked -p paddock --bin
# paddock` and scripts/build-ramdisk.sh (the ramdisk and the static programs). Options:
#   --no-build (or PADDOCK_DEB_NO_BUILD=1)  package what target/ already holds
#   --profile release|debug                 which paddock goes in (default release; debug
#                                           packages target/debug/paddock and saves tests a
#                                           release build; the ramdisk's programs are always
#                                           the release ones build-ramdisk.sh makes)
# Needs dpkg-deb and dpkg-parsechangelog/dpkg-shlibdeps (dpkg, dpkg-dev), strip (binutils),
# gzip; not root (dpkg-deb --root-owner-group). scripts/check-deb.sh checks the result.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: build-deb.sh [--no-build] [--profile release|debug]"
build=1
[[ ${PADDOCK_DEB_NO_BUILD:-0} == 1 ]] && build=0
profile=release
while (($#)); do
  case "$1" in
    --no-build) build=0; shift ;;
    --profile) profile="${2:-}"; shift 2 || { echo "build-deb: --profile needs a value ($usage)" >&2; exit 2; } ;;
    --profile=*) profile="${1#--profile=}"; shift ;;
    -h | --help) echo "$usage"; exit 0 ;;
    *) echo "build-deb: unknown argument $1 ($usage)" >&2; exit 2 ;;
  esac
done
[[ $profile == release || $profile == debug ]] || { echo "build-deb: --profile is release or debug, not $profile" >&2; exit 2; }

for tool in dpkg-deb dpkg-parsechangelog dpkg-shlibdeps strip gzip; do
  command -v "$tool" >/dev/null || {
    echo "build-deb: $tool is missing (packages dpkg, dpkg-dev, binutils, gzip: scripts/install-deps.sh)" >&2
    exit 1
  }
done

src=packaging/debian
arch=$(dpkg --print-architecture)
[[ $arch == amd64 ]] || { echo "build-deb: the package holds the x86-64 ramdisk and is built on amd64, not $arch" >&2; exit 1; }

# The crate's version: the paddock crate's own, or the workspace's when it inherits it.
crate_version=$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && /^version *=/ { print $2; exit }' appliance/Cargo.toml)
if [[ -z $crate_version ]]; then
  crate_version=$(awk -F'"' '/^\[/ { s = $0 } s == "[workspace.package]" && /^version *=/ { print $2; exit }' Cargo.toml)
fi
[[ -n $crate_version ]] || { echo "build-deb: no version in appliance/Cargo.toml or the workspace's Cargo.toml" >&2; exit 1; }
deb_version=$(dpkg-parsechangelog -l "$src/changelog" -S Version)
if [[ ${deb_version%-*} != "$crate_version" ]]; then
  echo "build-deb: $src/changelog's newest entry is $deb_version but the crate is $crate_version:" \
    "add an entry for $crate_version-1 at its top" >&2
  exit 1
fi
maintainer=$(dpkg-parsechangelog -l "$src/changelog" -S Maintainer)
SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -l "$src/changelog" -S Timestamp)
export SOURCE_DATE_EPOCH

if ((build)); then
  if [[ $profile == release ]]; then
    cargo build --release --locked -p paddock --bin paddock
  else
    cargo build --locked -p paddock --bin paddock
  fi
  scripts/build-ramdisk.sh
fi

static=target/x86_64-unknown-linux-gnu/static
paddock_bin=target/$profile/paddock
release_flag=""
[[ $profile == release ]] && release_flag=" --release"
inputs=("$paddock_bin" "$static/paddock-subd" "$static/fs2objectcache" target/ramdisk/vmlinuz target/ramdisk/initrd.img)
for f in "${inputs[@]}"; do
  [[ -s $f ]] || {
    echo "build-deb: $f is missing: run without --no-build (or cargo build$release_flag --locked -p paddock" \
      "--bin paddock; scripts/build-ramdisk.sh)" >&2
    exit 1
  }
done

out=target/debian
stage=$out/paddock
rm -rf "$stage"
umask 022
mkdir -p "$stage/DEBIAN"

# What dh_strip does to executables, and --strip-unneeded: no symbols, no debug line tables.
strip_into() {
  install -D -m 0755 "$1" "$2"
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$2"
}
strip_into "$paddock_bin" "$stage/usr/bin/paddock"
strip_into "$static/paddock-subd" "$stage/usr/lib/paddock/bin/paddock-subd"
strip_into "$static/fs2objectcache" "$stage/usr/lib/paddock/bin/fs2objectcache"
install -D -m 0644 target/ramdisk/vmlinuz "$stage/usr/lib/paddock/ramdisk/vmlinuz"
install -D -m 0644 target/ramdisk/initrd.img "$stage/usr/lib/paddock/ramdisk/initrd.img"
install -D -m 0644 "$src/paddock.service" "$stage/lib/systemd/system/paddock.service"
install -D -m 0644 "$src/paddock.toml" "$stage/etc/paddock/paddock.toml"

doc=$stage/usr/share/doc/paddock
install -D -m 0644 "$src/copyright" "$doc/copyright"
gzip -9n <"$src/changelog" >"$doc/changelog.Debian.gz"
gzip -9n <README.md >"$doc/README.md.gz"
gzip -9n <docs/api.md >"$doc/api.md.gz"
# The examples: the appliance's own role spec with its template, and its hooks with the
# simulated service they run (the hooks find it as ../lib/sim.sh, so the layout is kept).
ex=$doc/examples
install -D -m 0644 spec/appliance.toml "$ex/spec/appliance.toml"
install -D -m 0644 spec/templates/etcd/etcd.env.j2 "$ex/spec/templates/etcd/etcd.env.j2"
install -D -m 0644 hooks/README.md "$ex/hooks/README.md"
for h in hooks/appliance/*.sh hooks/lib/sim.sh; do
  install -D -m 0755 "$h" "$ex/$h"
done
chmod 0644 "$doc"/*.gz

for s in postinst prerm postrm; do
  install -m 0755 "$src/$s" "$stage/DEBIAN/$s"
done
install -m 0644 "$src/conffiles" "$stage/DEBIAN/conffiles"
install -D -m 0644 "$src/lintian-overrides" "$stage/usr/share/lintian/overrides/paddock"

# Depends on the shared libraries paddock links, with the versions their symbols need
# (dpkg-shlibdeps reads debian/control, so it runs in a directory that has a minimal one).
shlibs_dir=$(mktemp -d)
trap 'rm -rf "$shlibs_dir"' EXIT
mkdir "$shlibs_dir/debian"
printf 'Source: paddock\n\nPackage: paddock\nArchitecture: any\n' >"$shlibs_dir/debian/control"
abs_bin=$(realpath "$stage/usr/bin/paddock")
shlibs=$(cd "$shlibs_dir" && dpkg-shlibdeps -O "-e$abs_bin" 2>"$shlibs_dir/err") || {
  cat "$shlibs_dir/err" >&2
  exit 1
}
shlibs=$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs")
[[ -n $shlibs ]] || { echo "build-deb: dpkg-shlibdeps found no libraries for paddock" >&2; exit 1; }

# md5sums of every file but the conffiles (everything under /etc), as dh_md5sums writes them.
(cd "$stage" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | LC_ALL=C sort -z |
  xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"

# Installed-Size as dpkg-gencontrol counts it: KiB per file rounded up, 1 per other entry.
installed_size=$(cd "$stage" && find . -path ./DEBIAN -prune -o ! -path . -printf '%y %s\n' |
  awk '$1 == "f" { n += int(($2 + 1023) / 1024); next } { n += 1 } END { print n }')
sed -e "s|@VERSION@|$deb_version|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
  -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@SHLIBS_DEPENDS@|$shlibs|" \
  "$src/control" >"$stage/DEBIAN/control"
if grep -q '@[A-Z_]*@' "$stage/DEBIAN/control"; then
  echo "build-deb: $src/control has a placeholder this script does not fill:" >&2
  grep '@[A-Z_]*@' "$stage/DEBIAN/control" >&2
  exit 1
fi

find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$out/paddock_${deb_version}_${arch}.deb
rm -f "$out"/paddock_*.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "build-deb: $deb $(stat -c %s "$deb") bytes ($profile paddock; Installed-Size $installed_size KiB; Depends: $shlibs, adduser, ipxe, nftables)"
