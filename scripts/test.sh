#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine, as root:
#   installs the client tools and QEMU the tests use, builds the discovery ramdisk and the
#   Debian minbase test images (debootstrap, from the mirror apt uses), checks
#   formatting and lints, then runs every unit, integration and VM test (they build and
#   remove their own network namespaces, with 198.18.0.0/15 addresses only).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# A fresh build took 3.5 GB of target/ (line tables only, no incremental) and the test images
# about 2 GB; ask for room to spare, and say so plainly rather than fail mid-link.
need_gb=10
free_gb=$(df --output=avail -BG . | tail -1 | tr -dc 0-9)
if (( free_gb < need_gb )); then
  echo "test.sh: only ${free_gb} GB free under $(pwd); the build and the tests need about ${need_gb} GB" >&2
  echo "test.sh: (cargo clean in other checkouts of this project frees most of it)" >&2
  exit 1
fi
scripts/build-ramdisk.sh   # the VM scenarios boot it
scripts/test-images.sh     # Debian minbase images for the image, scan and update tests
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The dominator's bench binary is behind a feature (it links subd's scanner).
cargo clippy -p paddock-dominator --features bench --all-targets --locked -- -D warnings
cargo test --workspace --locked --all-targets --exclude paddock-vm-tests
# The VM scenarios print each VM's power-on → enrolled time.
cargo test --locked -p paddock-vm-tests --all-targets -- --nocapture
