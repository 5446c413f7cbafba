#!/bin/sh
# The simulated service behind the example hooks: "starting" an instance runs
# `paddock census hold`, which registers the instance in the appliance's census under a
# store lease and keeps the lease alive until it is stopped; "stopping" it ends that
# process (the registration goes with its lease, at once: the holder revokes it).
#
#   sim.sh start|stop ROLE [-h HOST] [-i INSTANCE] [--ttl SECONDS] [other flags, ignored]
#
# Untrusted text (host names, instance ids) only ever appears as quoted arguments; nothing
# is eval'd, and the pid file's name is checked before use.
set -eu
action=$1
role=$2
shift 2
host=""
ttl=10
instance="${PADDOCK_INSTANCE:-}"
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --host) host=$2; shift 2 ;;
    -i | --instance) instance=$2; shift 2 ;;
    --ttl) ttl=$2; shift 2 ;;
    -*) shift 2 ;;
    *) echo "sim.sh: unexpected argument: $1" >&2; exit 2 ;;
    esac
done
case "$instance" in
"" | -* | *[!A-Za-z0-9._-]*) echo "sim.sh: bad instance id: $instance" >&2; exit 2 ;;
esac
state="${PADDOCK_HOOK_STATE:-/run/paddock/hooks}"
mkdir -p "$state"
pidfile="$state/$role.$instance.pid"
paddock="${PADDOCK_BIN:-paddock}"
case "$action" in
start)
    set -- "$paddock" census hold --url "$PADDOCK_URL" --role "$role" --instance "$instance" --ttl "$ttl"
    if [ -n "$host" ]; then set -- "$@" --host "$host"; fi
    # A host of the test lab is a network namespace of the same name, when there is one.
    if [ -n "$host" ] && [ -e "/run/netns/$host" ]; then set -- ip netns exec "$host" "$@"; fi
    setsid "$@" </dev/null >/dev/null 2>&1 &
    echo $! >"$pidfile"
    echo "started $role instance $instance${host:+ on $host} (pid $!)"
    ;;
stop)
    if [ -f "$pidfile" ]; then
        kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
        echo "stopped $role instance $instance"
    else
        echo "no pid file for $role instance $instance; nothing to stop"
    fi
    ;;
*) echo "sim.sh: start or stop, not $action" >&2; exit 2 ;;
esac
