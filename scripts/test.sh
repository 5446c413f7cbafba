#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root:
#   installs the client tools and QEMU the tests use, builds the discovery ramdisk and the
#   Debian minbase test images (debootstrap, from the mirror apt uses), checks
#   formatting and lints, then runs every unit, integration and VM test (they build and
#   remove their own network namespaces, with 198.18.0.0/15 addresses only).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time, and at the end the slowest test binaries, so that a regression is seen.
STEPS=()
step() { # step LABEL CMD...: runs CMD, its output also kept for the summary
  local t0=$SECONDS
  "${@:2}" 2>&1 | tee -a "$LOG"
  STEPS+=("$(printf '%5d s  %s' $((SECONDS - t0)) "$1")")
}
summary() {
  echo "test.sh: steps"
  printf '  %s\n' "${STEPS[@]}"
  echo "test.sh: the slowest test binaries"
  # `Running <source> (<binary>)` … `test result: … finished in <N>s`
  awk '/^ *Running / { bin = ""; for (i = 2; i <= NF; i++) if ($i ~ /^\(/) { b = $i; gsub(/^\(target\/[a-z]+\/deps\/|-[0-9a-f]+\)$/, "", b); bin = b " " $(i - 1) } }
       /^ *Doc-tests / { bin = "doc-tests " $2 }
       /^test result:/ && bin != "" { n = split($0, w, " "); t = w[n]; sub(/s$/, "", t); printf "%8.1f s  %s\n", t, bin }' "$LOG" |
    sort -rn | head -10
}
LOG=$(mktemp "${TMPDIR:-/tmp}/paddock-test.XXXXXX")
trap 'summary; rm -f "$LOG"' EXIT

step install-deps scripts/install-deps.sh
# A fresh build took 3.5 GB of target/ (line tables only, no incremental) and the test images
# about 2 GB; ask for room to spare, and say so plainly rather than fail mid-link.
need_gb=10
free_gb=$(df --output=avail -BG . | tail -1 | tr -dc 0-9)
if (( free_gb < need_gb )); then
  echo "test.sh: only ${free_gb} GB free under $(pwd); the build and the tests need about ${need_gb} GB" >&2
  echo "test.sh: (cargo clean in other checkouts of this project frees most of it)" >&2
  exit 1
fi
step ramdisk scripts/build-ramdisk.sh   # the VM scenarios boot it
step ramdisk-arm64 scripts/build-ramdisk.sh --arch aarch64   # the arm64 VM scenario boots it
step images scripts/test-images.sh     # Debian minbase images for the image, scan and update tests
step fmt cargo fmt --all -- --check
step clippy cargo clippy --workspace --all-targets --locked -- -D warnings
# The dominator's bench binary is behind a feature (it links subd's scanner).
step clippy-bench cargo clippy -p paddock-dominator --features bench --all-targets --locked -- -D warnings
# The fuzz targets live in a workspace of their own (libFuzzer, run by cargo-fuzz); checking
# that they still compile keeps them from falling behind the APIs they call. Checked in the
# main target directory with the main profiles (a copy in fuzz/Cargo.toml, kept equal here),
# it reuses what clippy checked (cold: 20 s instead of 63 s).
profiles() { sed -n '/^\[profile/,$p' "$1"; }
if ! diff <(profiles Cargo.toml) <(profiles fuzz/Cargo.toml) >/dev/null; then
  echo "test.sh: fuzz/Cargo.toml's [profile] sections differ from Cargo.toml's; copy them over" >&2
  exit 1
fi
step fuzz-check cargo check --locked --manifest-path fuzz/Cargo.toml --bins --target-dir target
step tests-build cargo test --workspace --locked --all-targets --exclude paddock-vm-tests --no-run
# The two BMC emulator tests spend most of their 110 s waiting out a power-on throttle's real
# 10 s windows, at a tenth of a core: they run in a lane of their own beside the others (a
# cargo that only runs tests holds no lock), and the lane's output follows theirs.
BMC_TESTS=(redfish_and_ipmi_drive_the_emulators_and_fail_clearly
  through_the_appliance_power_ons_are_spaced_and_bad_bmcs_fail_clearly)
SIDE=$(mktemp "${TMPDIR:-/tmp}/paddock-test-bmc.XXXXXX")
side_t0=$SECONDS
(cargo test --locked -p paddock-power --test bmc -- --exact "${BMC_TESTS[0]}" &&
  cargo test --locked -p paddock --test power_bmc -- --exact "${BMC_TESTS[1]}") >"$SIDE" 2>&1 &
side=$!
step tests cargo test --workspace --locked --all-targets --exclude paddock-vm-tests -- \
  --skip "${BMC_TESTS[0]}" --skip "${BMC_TESTS[1]}"
side_status=0
wait "$side" || side_status=$?
tee -a "$LOG" <"$SIDE"
rm -f "$SIDE"
STEPS+=("$(printf '%5d s  %s' $((SECONDS - side_t0)) "tests-bmc (beside tests)")")
if (( side_status != 0 )); then
  echo "test.sh: the BMC tests failed (output above)" >&2
  exit "$side_status"
fi
# The Debian package, from what the steps above built (the debug paddock the tests ran; a
# release build here would add minutes), through lintian and systemd-analyze.
step deb bash -c 'scripts/build-deb.sh --no-build --profile debug && scripts/check-deb.sh'
# The VM scenarios print each VM's power-on → enrolled time.
step vm-tests cargo test --locked -p paddock-vm-tests --all-targets -- --nocapture
