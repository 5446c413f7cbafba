#!/bin/sh
# BlacKnight's test/sim/hooks/start_hadoop, for spec/blacknight-sim.toml: starts a simulated
# hadoop instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" start hadoop "$@"
