#!/usr/bin/env bash
# Makes the upgrade fixture: a data directory written by an earlier release's `paddock serve`
# (REV, default 5180068: the last commit before store versions), with what an
# operator's appliance holds: the CA and certificates, enrolled nodes, a DHCP lease, an image,
# an introspection rule and an operator token. appliance/tests/upgrade.rs starts today's
# binary on it and checks that everything is still there after the migration.
#
# Output, in appliance/tests/fixtures/:
#   store-<rev>.tar.gz      the data directory (store.db, certs/, images/)
#   store-<rev>.json        what the test expects to find (names, UUIDs, MACs, the lease, the
#                           image, the rule, the CA fingerprint)
#   store-<rev>.open.sql    the statements REV's store runs when it opens a file: the test
#                           replays them on the migrated file, which must refuse them
# (made only when missing: an existing fixture is kept, and checked). Then the checks that
# need the old binary itself, printed, the script failing if one does not hold:
#   - today's binary migrates a copy, and REV's binary started on the migrated copy refuses it;
#   - a mixed cluster on etcd: a host of REV and a host of today share one etcd; today's
#     migrates the store as it joins (a compatible step), and REV's keeps serving: what
#     either writes, the other reads.
#
# Run as root, from a clean checkout:  scripts/store-fixture.sh [REV]
# It builds REV in a git worktree (into target/fixture-old), and today's binary.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REV=${1:-5180068}
SHORT=$(git rev-parse --short=7 "$REV")
OUT=appliance/tests/fixtures
NS=pdk-fixture
IP=198.18.0.1
WORK=$(mktemp -d /tmp/paddock-fixture.XXXXXX)
cleanup() {
    ip netns pids "$NS-srv" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$NS-srv" 2>/dev/null || true
    ip netns del "$NS-cli" 2>/dev/null || true
    git worktree remove --force "$WORK/src" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
log() { echo "store-fixture: $*" >&2; }

log "building $SHORT"
git worktree add --detach "$WORK/src" "$REV" >/dev/null
# A target directory of its own: cargo names a workspace crate's artifacts by its path inside
# the workspace, so two checkouts sharing one directory would take each other's builds.
(cd "$WORK/src" && CARGO_TARGET_DIR=$ROOT/target/fixture-old cargo build --locked -q -p paddock --bin paddock)
cp target/fixture-old/debug/paddock "$WORK/paddock-old"
# Through a file: awk stops reading at the end of SCHEMA, and a pipe would fail git show.
git show "$REV:store/src/sqlite.rs" >"$WORK/sqlite.rs"
awk '/^const SCHEMA: &str = "$/ { on = 1; next } on && /^";$/ { exit } on' "$WORK/sqlite.rs" >"$WORK/open.sql"
grep -q 'CREATE TABLE IF NOT EXISTS kv' "$WORK/open.sql" || { log "no SCHEMA in $REV's store"; exit 1; }
log "building today's binary"
cargo build --locked -q -p paddock --bin paddock
NEW=$ROOT/target/debug/paddock

ip netns add "$NS-srv"
ip netns add "$NS-cli"
ip link add pdkfx-s netns "$NS-srv" type veth peer name pdkfx-c netns "$NS-cli"
ip -n "$NS-srv" addr add "$IP/24" dev pdkfx-s
ip -n "$NS-srv" link set pdkfx-s up
ip -n "$NS-srv" link set lo up
ip -n "$NS-cli" link set pdkfx-c up
in_srv() { ip netns exec "$NS-srv" "$@"; }

DATA=$WORK/data
cat >"$WORK/paddock.toml" <<EOF
data_dir = "$DATA"
[http]
listen = "$IP:8080"
[dhcp]
interfaces = ["pdkfx-s"]
[[dhcp.subnets]]
network = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
lease_time = 1000000000   # about 31 years: the fixture's lease is still bound when the test runs
[tftp]
enabled = false
[boot.discovery]
kernel = "http://$IP:8080/boot/assets/vmlinuz"
initrd = "http://$IP:8080/boot/assets/initrd.img"
EOF
start() { # start BINARY CONFIG LOG ADDRESS: starts it, waits for /healthz; sets SERVE_PID
    # Not through in_srv: a function run with & is a subshell, and $! would be that shell.
    ip netns exec "$NS-srv" "$1" serve --config "$2" >"$3" 2>&1 &
    SERVE_PID=$!   # ip netns exec execs the program: this is the appliance itself
    for _ in $(seq 100); do
        in_srv curl -sf -m 1 "http://$4:8080/healthz" >/dev/null && return 0
        sleep 0.2
    done
    cat "$3" >&2
    return 1
}
serve() { start "$1" "$WORK/paddock.toml" "$2" "$IP"; } # serve BINARY LOG
stop() { kill -TERM "$SERVE_PID" 2>/dev/null || true; wait "$SERVE_PID" || true; }

CERTS=$DATA/certs
api() { # api METHOD PATH [BODY] [HOST] [CERTS]
    local host=${4:-$IP} certs=${5:-$CERTS}
    in_srv curl -sf -m 20 --cacert "$certs/ca.pem" --cert "$certs/admin.pem" --key "$certs/admin.key" \
        -X "$1" -H 'Content-Type: application/json' ${3:+--data-binary "$3"} "https://$host:8443$2"
}
make_fixture() {
in_srv "$WORK/paddock-old" certs --config "$WORK/paddock.toml" init >/dev/null
serve "$WORK/paddock-old" "$WORK/old.log"
api POST /api/v1/nodes '{"name":"rack1-u1","macs":["52:54:00:f1:00:01"],"driver":"ipmi","properties":{"cpus":8}}' >"$WORK/node1.json"
api POST /api/v1/nodes '{"name":"rack1-u2","macs":["52:54:00:f1:00:02","52:54:00:f1:01:02"]}' >"$WORK/node2.json"
api POST /v1/rules '{"description":"rack from the fixture","conditions":[{"op":"eq","field":"inventory.cpu.count","value":8}],"actions":[{"action":"set-attribute","path":"/extra/rack","value":"r1"}]}' >"$WORK/rule.json"
# A lease, taken by a real client.
ip netns exec "$NS-cli" busybox udhcpc -i pdkfx-c -n -q -f -t 5 -T 1 -s /bin/true >/dev/null 2>&1
MAC=$(ip netns exec "$NS-cli" cat /sys/class/net/pdkfx-c/address)
api GET /api/v1/leases >"$WORK/leases.json"
# An image: a small tree.
mkdir -p "$WORK/tree/etc"
echo fixture >"$WORK/tree/etc/hostname"
head -c 65536 /dev/urandom >"$WORK/tree/etc/blob"
tar --numeric-owner -C "$WORK/tree" -cf "$WORK/image.tar" .
in_srv env PADDOCK_API="https://$IP:8443" PADDOCK_CA="$CERTS/ca.pem" PADDOCK_CERT="$CERTS/admin.pem" \
    PADDOCK_KEY="$CERTS/admin.key" "$WORK/paddock-old" image add fixture/base.1 "$WORK/image.tar" >/dev/null
TOKEN=$(in_srv "$WORK/paddock-old" certs --config "$WORK/paddock.toml" token fixture-operator --role read-only --days 3650)
FINGERPRINT=$(in_srv "$WORK/paddock-old" certs --config "$WORK/paddock.toml" show | awk '/sha256/ { print $NF; exit }')
stop

python3 - "$WORK" "$MAC" "$TOKEN" "$FINGERPRINT" "$SHORT" >"$WORK/expected.json" <<'PY'
import json, sys
work, mac, token, fingerprint, rev = sys.argv[1:]
load = lambda n: json.load(open(f"{work}/{n}.json"))
leases = [l for l in load("leases") if l.get("mac") == mac]
assert leases, f"no lease for {mac}"
rule = load("rule")
print(json.dumps({
    "rev": rev,
    "nodes": [{"uuid": n["uuid"], "name": n["name"]} for n in (load("node1"), load("node2"))],
    "lease": {"mac": mac, "ip": leases[0]["ip"]},
    "image": "fixture/base.1",
    "rule": rule.get("uuid") or rule.get("id"),
    "token": token,
    "ca_fingerprint": fingerprint,
}, indent=2))
PY

mkdir -p "$OUT"
tar --numeric-owner -C "$DATA" -czf "$OUT/store-$SHORT.tar.gz" .
cp "$WORK/expected.json" "$OUT/store-$SHORT.json"
cp "$WORK/open.sql" "$OUT/store-$SHORT.open.sql"
log "wrote $OUT/store-$SHORT.{tar.gz,json,open.sql} ($(stat -c %s "$OUT/store-$SHORT.tar.gz") bytes)"
}
if [[ -s $OUT/store-$SHORT.tar.gz ]]; then
    log "$OUT/store-$SHORT.tar.gz exists: kept (remove it to make it again); checking"
else
    make_fixture
fi

# The check only the old binary can make: today's migrates a copy, then REV's refuses it.
rm -rf "$DATA"
mkdir -p "$DATA"
tar -C "$DATA" -xzf "$OUT/store-$SHORT.tar.gz"
serve "$NEW" "$WORK/new.log"
stop
grep -q 'store: migrated' "$WORK/new.log" || { cat "$WORK/new.log" >&2; log "today's binary did not migrate"; exit 1; }
if in_srv timeout 20 "$WORK/paddock-old" serve --config "$WORK/paddock.toml" >"$WORK/refused.log" 2>&1; then
    log "$SHORT's binary served the migrated store"
    exit 1
fi
grep -q 'opened by a newer paddock' "$WORK/refused.log" || { cat "$WORK/refused.log" >&2; log "$SHORT failed for another reason"; exit 1; }
log "$SHORT's binary refuses the migrated store: $(grep -o 'this Paddock store.*' "$WORK/refused.log" | head -1)"

# A mixed-version cluster: one etcd, host "old" (REV) at .11 and host "new" (today) at .12.
log "mixed cluster: $SHORT and today's binary on one etcd"
in_srv ip addr add 198.18.0.11/24 dev pdkfx-s
in_srv ip addr add 198.18.0.12/24 dev pdkfx-s
ip netns exec "$NS-srv" etcd --name fx --data-dir "$WORK/etcd" --listen-client-urls "http://$IP:2379" \
    --advertise-client-urls "http://$IP:2379" --listen-peer-urls "http://$IP:2380" \
    --initial-advertise-peer-urls "http://$IP:2380" --initial-cluster "fx=http://$IP:2380" \
    --log-level error >"$WORK/etcd.log" 2>&1 &
ETCD_PID=$!
for _ in $(seq 100); do
    in_srv env ETCDCTL_API=3 etcdctl --endpoints "http://$IP:2379" endpoint health >/dev/null 2>&1 && break
    sleep 0.2
done
host_config() { # host_config NAME ADDRESS
    cat <<EOF
data_dir = "$WORK/$1"
[http]
listen = "$2:8080"
[dhcp]
enabled = false
[tftp]
enabled = false
[boot.discovery]
kernel = "http://$2:8080/boot/assets/vmlinuz"
initrd = "http://$2:8080/boot/assets/initrd.img"
[cluster]
store = "etcd"
etcd_endpoints = ["http://$IP:2379"]
host = "$1"
peers = ["http://198.18.0.11:8080", "http://198.18.0.12:8080"]
EOF
}
host_config old 198.18.0.11 >"$WORK/old.toml"
host_config new 198.18.0.12 >"$WORK/new.toml"
start_host() { # start_host BINARY NAME ADDRESS: certs init, then serve; sets HOST_PID
    in_srv "$1" certs --config "$WORK/$2.toml" init >/dev/null
    start "$1" "$WORK/$2.toml" "$WORK/$2-serve.log" "$3"
    HOST_PID=$SERVE_PID
}
start_host "$WORK/paddock-old" old 198.18.0.11
PID_old=$HOST_PID
api POST /api/v1/nodes '{"name":"before-upgrade","macs":["52:54:00:f2:00:01"]}' 198.18.0.11 "$WORK/old/certs" >/dev/null
start_host "$NEW" new 198.18.0.12
PID_new=$HOST_PID
grep -q 'store: migrated' "$WORK/new-serve.log" || { cat "$WORK/new-serve.log" >&2; log "today's host did not migrate the cluster's store"; exit 1; }
api POST /api/v1/nodes '{"name":"written-by-old","macs":["52:54:00:f2:00:02"]}' 198.18.0.11 "$WORK/old/certs" >/dev/null ||
    { log "$SHORT's host could not write after the migration"; exit 1; }
api POST /api/v1/nodes '{"name":"written-by-new","macs":["52:54:00:f2:00:03"]}' 198.18.0.12 "$WORK/new/certs" >/dev/null
for n in before-upgrade written-by-old written-by-new; do
    for h in old:198.18.0.11 new:198.18.0.12; do
        api GET "/api/v1/nodes/$n" "" "${h#*:}" "$WORK/${h%%:*}/certs" >/dev/null ||
            { log "host ${h%%:*} cannot read node $n"; exit 1; }
    done
done
stamp=$(in_srv env ETCDCTL_API=3 etcdctl --endpoints "http://$IP:2379" get --print-value-only paddock/schema)
kill -TERM "$PID_old" "$PID_new" 2>/dev/null || true
wait "$PID_old" "$PID_new" || true
kill "$ETCD_PID" 2>/dev/null || true
wait "$ETCD_PID" || true
log "mixed cluster: today's host migrated the shared store to $stamp; $SHORT's host kept serving: both read the node written before the migration and each other's after it"
