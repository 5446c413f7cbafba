#!/bin/sh
# BlacKnight's test/sim/hooks/stop_db, for spec/blacknight-sim.toml: stops a simulated
# db instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop db "$@"
