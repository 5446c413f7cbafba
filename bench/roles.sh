#!/usr/bin/env bash
# The role engine at fleet scale (issue 17): `plan(spec, census)` for spec/appliance.toml
# (etcd, boot fronts and mirrors on their hosts, monitors, workers on every other machine)
# over HOSTS hosts, 10 of them appliance hosts. No peer: BlacKnight (Python 2, ZooKeeper)
# is not runnable here, and its diff is the per-path DFS the engine replaces; the goal is
# absolute.
#   plan_ms   the median of RUNS plans from an empty census: every instance to start, each
#             growth step all-or-nothing across the chain (worker → boot, monitor → mirror)
#   detail    (stderr) the steady-state re-plan the leader runs every round
# Prints:  roles hosts=<n> plan_ms=<t>
# Goal: plan_ms <= 50 at 1,000 hosts (2 cores shared).
# Run:  bash bench/roles.sh        Env: HOSTS=1000 RUNS=21 SPEC=spec/appliance.toml
set -euo pipefail
cd "$(dirname "$0")/.."
export HOSTS=${HOSTS:-1000} RUNS=${RUNS:-21} SPEC=${SPEC:-spec/appliance.toml}
cargo build --quiet --release -p paddock-roles --example plan_bench
exec target/release/examples/plan_bench
