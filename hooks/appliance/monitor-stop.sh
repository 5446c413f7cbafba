#!/bin/sh
# spec/appliance.toml's monitor role, stop hook (see monitor.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop monitor "$@"
