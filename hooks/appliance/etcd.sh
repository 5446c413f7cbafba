#!/bin/sh
# spec/appliance.toml's etcd role, start hook. An example: it runs the simulated service
# (hooks/lib/sim.sh); a real one would start the etcd service on the host named by --host
# (for instance over ssh) and have it register itself in the census.
exec "$(dirname "$0")/../lib/sim.sh" start etcd "$@"
