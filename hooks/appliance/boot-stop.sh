#!/bin/sh
# spec/appliance.toml's boot role, stop hook (see boot.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop boot "$@"
