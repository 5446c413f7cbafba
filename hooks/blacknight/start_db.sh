#!/bin/sh
# BlacKnight's test/sim/hooks/start_db, for spec/blacknight-sim.toml: starts a simulated
# db instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" start db "$@"
