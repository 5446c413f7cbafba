#!/usr/bin/env bash
# Checks the Debian package scripts/build-deb.sh made (or the .deb given as the argument):
#   - lintian finds no error (its warnings are counted and shown);
#   - `systemd-analyze verify` of paddock.service says nothing at all, checked against the
#     package's own tree (dpkg-deb -x) so that ExecStart's /usr/bin/paddock is the package's,
#     with the host's units beside it for what the unit depends on and orders itself after
#     (sysinit.target, network-online.target, nftables.service…: without them verify exits 1
#     and prints nothing);
#   - `systemd-analyze security --offline=yes` gives paddock.service a lower (better)
#     exposure level than Kea's kea-dhcp4-server.service, the DHCP server Paddock stands in
#     for. Kea's unit is the installed one, or else the one in the kea-dhcp4-server package
#     that apt downloads from the mirror it is configured with.
# Prints one line, `deb paddock_exposure=… kea_exposure=… lintian_errors=… lintian_warnings=…`,
# and exits non-zero if any check fails. Needs lintian, systemd (systemd-analyze), dpkg.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# > 1)); then
  echo "usage: check-deb.sh [PACKAGE.deb] (default: the one in target/debian/)" >&2
  exit 2
fi
if (($# == 1)); then
  deb=$1
else
  debs=(target/debian/paddock_*.deb)
  if [[ ! -f ${debs[0]} ]]; then
    echo "check-deb: no target/debian/paddock_*.deb: run scripts/build-deb.sh first" >&2
    exit 1
  fi
  if ((${#debs[@]} > 1)); then
    echo "check-deb: several packages in target/debian (${debs[*]}): name one" >&2
    exit 2
  fi
  deb=${debs[0]}
fi
[[ -f $deb ]] || { echo "check-deb: $deb: no such file" >&2; exit 1; }
for tool in lintian systemd-analyze dpkg-deb; do
  command -v "$tool" >/dev/null || {
    echo "check-deb: $tool is missing (packages lintian, systemd, dpkg: scripts/install-deps.sh)" >&2
    exit 1
  }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/paddock-check-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=()

# lintian: exits non-zero on errors, which are counted below. Its note about running as
# root goes to stderr and is no finding.
lintian_out=$(lintian --info --display-info "$deb" 2>"$work/lintian.err") || true
if grep -qv 'running with root privileges is not recommended' "$work/lintian.err"; then
  grep -v 'running with root privileges is not recommended' "$work/lintian.err" >&2
fi
lintian_errors=$(grep -c '^E: ' <<<"$lintian_out" || true)
lintian_warnings=$(grep -c '^W: ' <<<"$lintian_out" || true)
grep -E '^[EW]: ' <<<"$lintian_out" | sed 's/^/check-deb: lintian: /' >&2 || true
((lintian_errors == 0)) || failed+=("lintian found $lintian_errors errors")

# systemd-analyze verify, in the package's tree with the host's units beside it.
root=$work/root
dpkg-deb -x "$deb" "$root"
unit=lib/systemd/system/paddock.service
[[ -f $root/$unit ]] || { echo "check-deb: $deb has no /$unit" >&2; exit 1; }
for d in /lib/systemd/system /usr/lib/systemd/system; do
  [[ -d $d ]] && cp -an "$d/." "$root/lib/systemd/system/"
done
verify_rc=0
verify_out=$(systemd-analyze verify --root="$root" "$root/$unit" 2>&1) || verify_rc=$?
if [[ -n $verify_out || $verify_rc != 0 ]]; then
  sed 's/^/check-deb: systemd-analyze verify: /' <<<"$verify_out" >&2
  failed+=("systemd-analyze verify printed something or failed (exit $verify_rc)")
fi

# The exposure scores: "→ Overall exposure level for NAME: 1.7 OK".
exposure() {
  systemd-analyze security --offline=yes "$@" 2>/dev/null |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p'
}
paddock_exposure=$(exposure --root="$root" "$root/$unit")
kea_unit=/lib/systemd/system/kea-dhcp4-server.service
if [[ -f $kea_unit ]]; then
  kea_exposure=$(exposure "$kea_unit")
else
  # Not installed: the unit from the package, from the mirror apt is configured with.
  mkdir "$work/kea"
  sandbox=()
  [[ $EUID -eq 0 ]] && sandbox=(-o APT::Sandbox::User=root)
  if (cd "$work/kea" && apt-get "${sandbox[@]}" download -qq kea-dhcp4-server >"$work/kea.log" 2>&1); then
    dpkg-deb -x "$work/kea"/kea-dhcp4-server_*.deb "$work/kea/root"
    kea_exposure=$(exposure --root="$work/kea/root" "$work/kea/root$kea_unit")
  else
    cat "$work/kea.log" >&2
    echo "check-deb: Kea's unit is not installed and apt could not download kea-dhcp4-server" \
      "(apt-get update first?)" >&2
  fi
fi
kea_exposure=${kea_exposure:-}
[[ -n $paddock_exposure ]] || failed+=("no exposure level for paddock.service")
[[ -n $kea_exposure ]] || failed+=("no exposure level for kea-dhcp4-server.service")
if [[ -n $paddock_exposure && -n $kea_exposure ]] &&
  ! awk -v p="$paddock_exposure" -v k="$kea_exposure" 'BEGIN { exit !(p < k) }'; then
  failed+=("paddock.service's exposure $paddock_exposure is not lower than Kea's $kea_exposure")
fi

echo "deb paddock_exposure=${paddock_exposure:-none} kea_exposure=${kea_exposure:-none}" \
  "lintian_errors=$lintian_errors lintian_warnings=$lintian_warnings"
if ((${#failed[@]} > 0)); then
  printf 'check-deb: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
