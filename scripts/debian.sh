# Shared by scripts/test-images.sh and scripts/fresh-check.sh (sourced, not run): the Debian
# mirror apt is configured with, and a cached pristine Debian 12 (bookworm) minbase root.
# shellcheck shell=bash

SUITE=${SUITE:-bookworm}
# Kept outside the work tree so that fresh clones on the same machine (CI) reuse it.
PADDOCK_CACHE=${PADDOCK_CACHE:-/var/cache/paddock}

# apt_mirror: prints the URI of the first source apt uses for "$SUITE" itself (not -security
# or -updates), from deb822 `.sources` files or one-line `.list` files. $MIRROR overrides.
# No mirror is ever assumed: with none configured this fails and says where to look.
apt_mirror() {
  if [[ -n ${MIRROR:-} ]]; then
    echo "$MIRROR"
    return 0
  fi
  local etc=${APT_ETC:-/etc/apt} files=() f m
  for f in "$etc"/sources.list "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  if ((${#files[@]} > 0)); then
    m=$(awk -v suite="$SUITE" '
      function flush() {
        if (uris != "" && enabled && deb && index(suites, " " suite " ")) { print uris; found = 1 }
        uris = ""; suites = ""; enabled = 1; deb = 1
      }
      BEGIN { deb = 1; enabled = 1 }
      found { exit }
      FNR == 1 { flush(); if (found) exit }
      # one-line format: deb [options] URI suite components...
      /^[ \t]*deb[ \t]/ {
        n = split($0, w, /[ \t]+/); i = 2; if (w[1] == "") i++
        if (w[i] ~ /^\[/) { while (i <= n && w[i] !~ /\]$/) i++; i++ }
        if (w[i + 1] == suite) { print w[i]; found = 1; exit }
        next
      }
      # deb822: stanzas separated by blank lines
      tolower($1) == "uris:" { uris = $2 }
      tolower($1) == "suites:" { suites = " "; for (i = 2; i <= NF; i++) suites = suites $i " " }
      tolower($1) == "types:" { deb = 0; for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      tolower($1) == "enabled:" && tolower($2) == "no" { enabled = 0 }
      /^[ \t]*$/ { flush() }
      END { if (!found) flush() }
    ' "${files[@]}" 2>/dev/null | head -n1)
  fi
  # mirror+file:///etc/apt/mirrors/debian.list (Debian's cloud images): the first mirror
  # the file names.
  if [[ ${m:-} == mirror+file://* ]]; then
    local list=${m#mirror+file://}
    m=$(grep -Eo '^[[:space:]]*(https?|file)://[^[:space:]]+' "$list" 2>/dev/null | head -n1 | tr -d '[:space:]')
  fi
  if [[ ! ${m:-} =~ ^(https?|file):// ]]; then
    echo "no usable Debian mirror for '$SUITE' in apt's sources (/etc/apt/sources.list," \
      "/etc/apt/sources.list.d/; found '${m:-}'): configure apt (or set MIRROR=<uri>) and run again" >&2
    return 1
  fi
  echo "$m"
}

# minbase_tarball: prints the path of a tarball of a pristine `debootstrap --variant=minbase`
# root of $SUITE (numeric owners, no .deb files), made once and cached in $PADDOCK_CACHE.
minbase_tarball() {
  local tar=$PADDOCK_CACHE/debian-$SUITE-minbase.tar mirror tmp
  if [[ ! -s $tar ]]; then
    mirror=$(apt_mirror) || return 1
    command -v debootstrap >/dev/null || {
      echo "debootstrap is missing: run scripts/install-deps.sh" >&2
      return 1
    }
    mkdir -p "$PADDOCK_CACHE"
    tmp=$(mktemp -d "$PADDOCK_CACHE/minbase.XXXXXX")
    echo "debootstrap --variant=minbase $SUITE from $mirror (cached as $tar)" >&2
    if ! debootstrap --variant=minbase "$SUITE" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
      tail -20 "$tmp/debootstrap.log" >&2
      rm -rf "$tmp"
      return 1
    fi
    rm -f "$tmp/root/var/cache/apt/archives/"*.deb
    tar --numeric-owner -C "$tmp/root" -cf "$tmp/root.tar" .
    mv "$tmp/root.tar" "$tar"
    rm -rf "$tmp"
  fi
  echo "$tar"
}
