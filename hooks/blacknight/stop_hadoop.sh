#!/bin/sh
# BlacKnight's test/sim/hooks/stop_hadoop, for spec/blacknight-sim.toml: stops a simulated
# hadoop instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop hadoop "$@"
