#!/bin/sh
# BlacKnight's test/sim/hooks/stop_secondary_head, for spec/blacknight-sim.toml: stops a simulated
# secondary_head instance (hooks/lib/sim.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop secondary_head "$@"
