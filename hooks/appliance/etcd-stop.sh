#!/bin/sh
# spec/appliance.toml's etcd role, stop hook (see etcd.sh).
exec "$(dirname "$0")/../lib/sim.sh" stop etcd "$@"
