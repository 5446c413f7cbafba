#!/bin/sh
# BlacKnight's test/sim/hooks/start_secondary_head, for spec/blacknight-sim.toml: starts a simulated
# secondary_head instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" start secondary_head "$@"
