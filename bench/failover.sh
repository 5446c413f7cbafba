#!/usr/bin/env bash
# Failover of a three-host appliance: the leader is killed (SIGKILL) ROUNDS times; each time
# the time from the kill until another host holds the PXE pass rule is measured, while a
# sampler reads every host's ruleset every 100 ms and counts the samples with two pass rules.
# Prints `failover p50=<s> max=<s> double_pass=<n>` (goal: p50 <= 3 s, double_pass = 0).
# Everything runs in namespaces it creates (198.18.0.0/24), with real etcd members.
# Run as root (it builds the debug binaries it needs):  bash bench/failover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_guard failover
[[ $EUID -eq 0 ]] || { echo "run as root (network namespaces)" >&2; exit 1; }
scripts/install-deps.sh --bench   # etcd: the one list of packages
BIN=target/debug/paddock-failover
cargo build --locked -q -p paddock -p paddock-vm-tests
$BIN "${ROUNDS:-10}"
