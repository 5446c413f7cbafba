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
# Lanes: commands run in the background (beside the next step, or beside each other), each
# into a file of its own; `join_lanes` waits for them, appends their output to the log in
# the order they started (so the slowest-binaries summary sees it), records their times and
# fails if one failed. A cargo that only runs tests (built beforehand with --no-run, with the
# same package set) holds no lock, so lanes do not wait on each other.
LANE_NAMES=() LANE_PIDS=() LANE_OUTS=()
lane() { # lane LABEL CMD...
  local out
  out=$(mktemp "${TMPDIR:-/tmp}/paddock-test-lane.XXXXXX")
  (
    t0=$SECONDS
    rc=0
    "${@:2}" >"$out" 2>&1 || rc=$?
    echo "$rc $((SECONDS - t0))" >"$out.end"
    exit "$rc"
  ) &
  LANE_NAMES+=("$1") LANE_PIDS+=($!) LANE_OUTS+=("$out")
}
collect_lanes() { # waits for the lanes, appends their output, records their times
  local i rc secs
  LANES_FAILED=()
  for i in "${!LANE_PIDS[@]}"; do
    wait "${LANE_PIDS[$i]}" || true
    tee -a "$LOG" <"${LANE_OUTS[$i]}"
    read -r rc secs <"${LANE_OUTS[$i]}.end" || { rc=1 secs=0; }
    STEPS+=("$(printf '%5d s  %s' "$secs" "${LANE_NAMES[$i]} (a lane)")")
    ((rc == 0)) || LANES_FAILED+=("${LANE_NAMES[$i]}")
    rm -f "${LANE_OUTS[$i]}" "${LANE_OUTS[$i]}.end"
  done
  LANE_NAMES=() LANE_PIDS=() LANE_OUTS=()
}
join_lanes() {
  collect_lanes
  if ((${#LANES_FAILED[@]})); then
    echo "test.sh: failed in a lane (output above): ${LANES_FAILED[*]}" >&2
    exit 1
  fi
}
# `--test NAME` for each integration test file in DIR/tests, except those named in EXCEPT.
tests_in() { # tests_in DIR [EXCEPT...]
  local f name
  for f in "$1"/tests/*.rs; do
    name=$(basename "$f" .rs)
    [[ " ${*:2} " == *" $name "* ]] || printf -- '--test %s ' "$name"
  done
}
LOG=$(mktemp "${TMPDIR:-/tmp}/paddock-test.XXXXXX")
# A failed step still waits for the lanes beside it (see `lane`): nothing the script started
# outlives it, and their output is kept.
trap 'collect_lanes; summary; rm -f "$LOG"' EXIT

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

# Built with exactly the package sets the runs below name: cargo resolves dependency features
# per command line (paddock's dev-dependencies turn on features others share), so any other
# set would be compiled again inside the runs, holding the build lock the lanes wait on.
step tests-build bash -c "cargo test --workspace --locked --all-targets --exclude paddock-vm-tests \
  --exclude paddock --no-run && cargo test --locked -p paddock --all-targets --no-run &&
  cargo test --locked -p paddock-power --test bmc --no-run"
# Four lanes beside the step, which the CPU allows (sampled over a cold run):
# - the two BMC emulator tests spend most of their 110 s waiting out a power-on throttle's
#   real 10 s windows, at a tenth of a core;
# - the appliance's dominator tests (310 s one after the other, alone) mostly wait on their
#   rollouts' deadlines and health windows while the subds they start rescan: two lanes of
#   about 155 s each (one fleet at a time in each). They run at nice 10, so that their
#   bursts (twenty first scans at once) do not stretch the timing of the tests beside them;
# - everything else averaged under half of the machine when it ran alone (375 s beside the
#   dominator lanes): six of the appliance's longest test files (190 s of it) run in a
#   lane beside the rest. The whole is bound by the CPU now (99 % busy, half of it the
#   dominator tests' subds hashing their trees).
BMC_TESTS=(redfish_and_ipmi_drive_the_emulators_and_fail_clearly
  through_the_appliance_power_ons_are_spaced_and_bad_bmcs_fail_clearly)
lane tests-bmc bash -c "cargo test --locked -p paddock-power --test bmc -- --exact ${BMC_TESTS[0]} &&
  cargo test --locked -p paddock --test power_bmc -- --exact ${BMC_TESTS[1]}"
DOMINATOR_A=(twenty_subs_converge_to_minbase2_with_at_most_n_updating
  computed_files_follow_the_peers_are_checked_and_kept_in_place
  kill9_of_the_appliance_during_an_update_ends_converged
  the_required_image_changes_from_the_cli_and_the_console
  an_unsafe_image_is_held_until_cleared a_file_changed_by_hand_is_restored_within_a_poll_cycle)
lane tests-dominator-a nice -n 10 cargo test --locked -p paddock --test dominator -- \
  --exact "${DOMINATOR_A[@]}"
lane tests-dominator-b nice -n 10 cargo test --locked -p paddock --test dominator -- \
  --exact $(printf -- '--skip %s ' "${DOMINATOR_A[@]}")
APPLIANCE_LANE=(openstack_cli boot_trust dhcp6 roles security backup)
lane tests-appliance cargo test --locked -p paddock $(printf -- '--test %s ' "${APPLIANCE_LANE[@]}")
skip=(--skip "${BMC_TESTS[0]}" --skip "${BMC_TESTS[1]}")
step tests bash -c "cargo test --workspace --locked --all-targets --exclude paddock-vm-tests \
  --exclude paddock -- ${skip[*]} &&
  cargo test --locked -p paddock --lib --bins $(tests_in appliance dominator "${APPLIANCE_LANE[@]}") -- ${skip[*]}"
join_lanes
# The Debian package, from what the steps above built (the debug paddock the tests ran; a
# release build here would add minutes), through lintian and systemd-analyze.
step deb bash -c 'scripts/build-deb.sh --no-build --profile debug && scripts/check-deb.sh'
# The VM scenarios print each VM's power-on → enrolled time. Provisioning and the scenarios
# keep the machine busy (95 % and 77 % of it) and run one after the other; the HA, power and
# package scenarios each used half of it, and run side by side.
VM_SIDE=(ha power package)
step vm-tests-build cargo test --locked -p paddock-vm-tests --all-targets --no-run
step vm-tests bash -c "cargo test --locked -p paddock-vm-tests --lib --bins \
  $(tests_in vm-tests "${VM_SIDE[@]}") -- --nocapture"
for t in "${VM_SIDE[@]}"; do
  lane "vm-$t" cargo test --locked -p paddock-vm-tests --test "$t" -- --nocapture
done
join_lanes
