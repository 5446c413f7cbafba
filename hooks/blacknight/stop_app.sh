#!/bin/sh
# BlacKnight's test/sim/hooks/stop_app, for spec/blacknight-sim.toml: stops a simulated
# app instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop app "$@"
