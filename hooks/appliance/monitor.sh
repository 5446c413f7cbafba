#!/bin/sh
# spec/appliance.toml's monitor role, start hook. An example: it runs the simulated service
# (hooks/lib/sim.sh); a real one would start the monitor service on the host named by --host
# (for instance over ssh) and have it register itself in the census.
exec "$(dirname "$0")/../lib/sim.sh" start monitor "$@"
