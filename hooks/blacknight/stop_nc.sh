#!/bin/sh
# BlacKnight's test/sim/hooks/stop_nc, for spec/blacknight-sim.toml: stops a simulated
# node_controller instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop node_controller "$@"
