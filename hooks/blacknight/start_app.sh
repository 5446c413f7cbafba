#!/bin/sh
# BlacKnight's test/sim/hooks/start_app, for spec/blacknight-sim.toml: starts a simulated
# app instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" start app "$@"
