#!/bin/sh
# BlacKnight's test/sim/hooks/start_nc, for spec/blacknight-sim.toml: starts a simulated
# node_controller instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" start node_controller "$@"
