#!/usr/bin/env bash
# QEMU smoke test of the introspection ramdisk: builds the static agent and the initramfs, boots
# them in QEMU (TCG) on a tap inside a network namespace of its own, with dnsmasq for DHCP and a
# tiny Python stand-in for the appliance on 198.18.0.1:8080, then checks the posted inventory
# against the VM and that the VM powers itself off.
#
# Two boots:
#   1. the normal case: inventory matches the VM (2 CPUs, physical_mb 512, the disk's exact size
#      and serial, the NIC's MAC, bios), the appliance says poweroff, the VM powers off;
#   2. an unknown collector on the command line, plus LLDP listening (a Python "switch" sends
#      LLDP frames into the tap): the agent still posts, with `error` naming the collector and the
#      LLDP TLVs on the NIC, and follows a `wait` then a `poweroff`.
#
# Needs root, qemu-system-x86, dnsmasq, python3, busybox-static. Everything it creates (namespace
# pdkrd-smoke-<pid>, bridge pdkrdbr0, tap pdkrdtap0, processes, the work dir) is removed on exit;
# on failure the work dir is kept and printed.
#
#   ramdisk/tests/qemu-smoke.sh            # both boots
#   PDKRD_SKIP_BUILD=1 ramdisk/tests/qemu-smoke.sh
#   PDKRD_ONLY=1 ramdisk/tests/qemu-smoke.sh  # only the first boot
#   PDKRD_KEEP=1 ramdisk/tests/qemu-smoke.sh  # keep console logs and posted JSON
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
NS=pdkrd-smoke-$$
BR=pdkrdbr0
TAP=pdkrdtap0
MAC=52:54:00:12:34:56
SERVER_IP=198.18.0.1
PORT=8080
CACHE=${PDKRD_CACHE:-/var/cache/paddock/ramdisk}
BOOT_TIMEOUT=${PDKRD_BOOT_TIMEOUT:-300}
WORK=$(mktemp -d /tmp/pdkrd-smoke.XXXXXX)
PIDS=()
OK=0

cleanup() {
    # Our background processes, then anything else still running in our namespace (qemu when
    # interrupted): deleting a namespace's name does not stop its processes.
    local p
    for p in "${PIDS[@]}" $(ip netns pids "$NS" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    for _ in $(seq 20); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
    ip netns del "$NS" 2>/dev/null || true
    if [ "$OK" = 1 ] && [ -z "${PDKRD_KEEP:-}" ]; then
        rm -rf "$WORK"
    elif [ "$OK" = 1 ]; then
        echo "qemu-smoke: logs kept in $WORK"
    else
        echo "qemu-smoke: FAILED; logs kept in $WORK" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

need() { command -v "$1" >/dev/null || { echo "qemu-smoke: $1 is missing (apt-get install -y $2)" >&2; exit 1; }; }
need qemu-system-x86_64 qemu-system-x86
need dnsmasq dnsmasq
need python3 python3
[ -x /bin/busybox ] || { echo "qemu-smoke: /bin/busybox missing (apt-get install -y busybox-static)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "qemu-smoke: needs root (network namespaces, tap)" >&2; exit 1; }

AGENT=$REPO/target/x86_64-unknown-linux-gnu/static/paddock-agent
BUILDER=$REPO/target/release/paddock-ramdisk-build
if [ -z "${PDKRD_SKIP_BUILD:-}" ]; then
    echo "qemu-smoke: building the static agent and the builder"
    t=$(date +%s.%N)
    (cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
        cargo build --profile static -p paddock-ramdisk --bin paddock-agent --target x86_64-unknown-linux-gnu -q)
    (cd "$REPO" && cargo build --release -p paddock-ramdisk --bin paddock-ramdisk-build -q)
    echo "qemu-smoke: cargo builds took $(python3 -c "import time;print(round(time.time()-$t,1))") s"
fi
t=$(date +%s.%N)
"$BUILDER" --agent "$AGENT" --out "$WORK/out" --cache "$CACHE" | sed 's/^/  /'
echo "qemu-smoke: initramfs built in $(python3 -c "import time;print(round(time.time()-$t,1))") s"

# The disk: an odd size (1100 MiB + 3 sectors) so an exact match means something.
truncate -s $((1100 * 1024 * 1024 + 3 * 512)) "$WORK/disk.img"
DISK_SIZE=$(stat -c %s "$WORK/disk.img")

# The network: a namespace with a bridge holding 198.18.0.1/24 and the VM's tap.
ip netns add "$NS"
nsx() { ip netns exec "$NS" "$@"; }
nsx ip link set lo up
nsx ip link add "$BR" type bridge forward_delay 0
nsx ip addr add "$SERVER_IP/24" dev "$BR"
nsx ip tuntap add "$TAP" mode tap
nsx ip link set "$TAP" master "$BR"
nsx ip link set "$TAP" up
nsx ip link set "$BR" up

# Background processes are started with `ip netns exec` itself (it execs the command), never
# through a shell function, so that $! is the process to stop.
ip netns exec "$NS" dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --interface="$BR" --bind-interfaces \
    --dhcp-range=198.18.0.100,198.18.0.150,255.255.255.0,10m --dhcp-option=option:router,$SERVER_IP \
    --dhcp-leasefile="$WORK/dnsmasq.leases" --pid-file= --log-dhcp --log-facility="$WORK/dnsmasq.log" </dev/null >"$WORK/dnsmasq.out" 2>&1 &
PIDS+=($!)

cat > "$WORK/server.py" <<'PY'
"""Stand-in for the appliance: /v1/continue, /api/v1/agent/<uuid>/next, /api/v1/agent/events."""
import http.server, json, os, sys, time

work, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
UUID = "11111111-1111-1111-1111-111111111111"
waits_left = {"n": 0}

def record(rec):
    rec["t"] = time.time()
    with open(os.path.join(work, "http.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")

class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            data = json.loads(body)
        except ValueError:
            data = {"unparsable": body.decode(errors="replace")}
        record({"method": "POST", "path": self.path, "body": data})
        if self.path == "/v1/continue":
            print("POST /v1/continue\n" + json.dumps(data, indent=1, sort_keys=True), flush=True)
            self.reply(200, {"uuid": UUID})
        elif self.path == "/api/v1/agent/events":
            print("event " + json.dumps(data), flush=True)
            self.reply(200, {})
        elif self.path == "/control/wait":
            waits_left["n"] = int(data.get("n", 0))
            self.reply(200, {})
        else:
            self.reply(404, {"error": {"message": "no route " + self.path}})

    def do_GET(self):
        record({"method": "GET", "path": self.path})
        if self.path == "/api/v1/agent/%s/next" % UUID:
            if waits_left["n"] > 0:
                waits_left["n"] -= 1
                self.reply(200, {"action": "wait"})
            else:
                self.reply(200, {"action": "poweroff"})
        else:
            self.reply(404, {"error": {"message": "no route " + self.path}})

    def log_message(self, fmt, *args):
        sys.stderr.write("%.3f %s\n" % (time.time(), fmt % args))

http.server.ThreadingHTTPServer((ip, port), H).serve_forever()
PY
ip netns exec "$NS" python3 "$WORK/server.py" "$WORK" "$SERVER_IP" "$PORT" </dev/null >"$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
    nsx python3 -c "import socket;socket.create_connection(('$SERVER_IP',$PORT),0.2)" 2>/dev/null && break
    sleep 0.1
done

# boot NAME EXTRA_CMDLINE: boots the VM until it powers off (or BOOT_TIMEOUT).
boot() {
    local name=$1 extra=$2
    : >"$WORK/http.jsonl"
    local start end rc
    start=$(date +%s.%N)
    echo "qemu-smoke: [$name] booting (TCG, 512 MiB, 2 CPUs)"
    set +e
    # In the background plus `wait`, so that a signal interrupts the boot at once (bash runs
    # traps only between foreground commands).
    ip netns exec "$NS" timeout "$BOOT_TIMEOUT" qemu-system-x86_64 -accel tcg -m 512 -smp 2 -nographic -no-reboot \
        -kernel "$WORK/out/vmlinuz" -initrd "$WORK/out/initrd.img" \
        -append "console=ttyS0 BOOTIF=01-${MAC//:/-} paddock.url=http://$SERVER_IP:$PORT $extra" \
        -netdev tap,id=n0,ifname=$TAP,script=no,downscript=no \
        -device virtio-net-pci,netdev=n0,mac=$MAC \
        -drive file="$WORK/disk.img",if=none,id=d0,format=raw \
        -device virtio-blk-pci,drive=d0,serial=PDKRD-SMOKE-1 \
        </dev/null >"$WORK/console-$name.log" 2>&1 &
    wait $!
    rc=$?
    set -e
    end=$(date +%s.%N)
    cp "$WORK/http.jsonl" "$WORK/http-$name.jsonl"
    echo "qemu-smoke: [$name] qemu exited with $rc after $(python3 -c "print(round($end-$start,1))") s"
    if [ "$rc" = 124 ]; then
        echo "qemu-smoke: [$name] the VM did not power off within $BOOT_TIMEOUT s; last console lines:" >&2
        tail -20 "$WORK/console-$name.log" >&2
        return 1
    fi
    grep '^paddock-agent:' "$WORK/console-$name.log" | sed 's/^/  /'
    python3 - "$WORK" "$name" "$start" "$end" "$rc" "$MAC" "$DISK_SIZE" <<'PY'
import json, sys
work, name, start, end, rc, mac, disk_size = sys.argv[1:]
start, end, rc, disk_size = float(start), float(end), int(rc), int(disk_size)
recs = [json.loads(l) for l in open(f"{work}/http-{name}.jsonl")]
problems = []
def check(cond, what):
    if not cond:
        problems.append(what)
posts = [r for r in recs if r["path"] == "/v1/continue"]
check(len(posts) == 1, f"want exactly one POST /v1/continue, got {len(posts)}")
events = [r for r in recs if r["path"] == "/api/v1/agent/events"]
steps = [e["body"]["step"] for e in events]
nexts = [r for r in recs if r["method"] == "GET" and r["path"].endswith("/next")]
check(rc == 0, f"qemu exit status {rc}")
if posts:
    d = posts[0]["body"]
    inv = d.get("inventory") or {}
    cpu, mem = inv.get("cpu") or {}, inv.get("memory") or {}
    check(cpu.get("count") == 2, f"cpu.count {cpu.get('count')} != 2")
    check(cpu.get("architecture") == "x86_64", f"cpu.architecture {cpu.get('architecture')}")
    check(mem.get("physical_mb") == 512, f"memory.physical_mb {mem.get('physical_mb')} != 512")
    check(0 < (mem.get("total") or 0) <= 512 << 20, f"memory.total {mem.get('total')}")
    disks = inv.get("disks") or []
    check([x["name"] for x in disks] == ["/dev/vda"], f"disks {[x['name'] for x in disks]}")
    if disks:
        check(disks[0]["size"] == disk_size, f"disk size {disks[0]['size']} != {disk_size}")
        check(disks[0].get("serial") == "PDKRD-SMOKE-1", f"disk serial {disks[0].get('serial')}")
        check((disks[0].get("by_path") or "").startswith("/dev/disk/by-path/pci-0000:00:"), f"by_path {disks[0].get('by_path')}")
    nics = inv.get("interfaces") or []
    check([n.get("mac_address") for n in nics] == [mac], f"NIC MACs {[n.get('mac_address') for n in nics]}")
    if nics:
        check((nics[0].get("ipv4_address") or "").startswith("198.18.0."), f"ipv4 {nics[0].get('ipv4_address')}")
        check(nics[0].get("driver") == "virtio_net", f"driver {nics[0].get('driver')}")
        check(nics[0].get("has_carrier") is True, "no carrier")
    boot = inv.get("boot") or {}
    check(boot.get("current_boot_mode") == "bios", f"boot mode {boot.get('current_boot_mode')}")
    check(boot.get("pxe_interface") == mac, f"pxe_interface {boot.get('pxe_interface')}")
    check(d.get("boot_interface") == "01-" + mac.replace(":", "-"), f"boot_interface {d.get('boot_interface')}")
    check((inv.get("system_vendor") or {}).get("manufacturer") == "QEMU", f"system_vendor {inv.get('system_vendor')}")
    if name == "normal":
        check(d.get("error") is None, f"error {d.get('error')}")
        check(d.get("configuration") == {"collectors": ["default"]}, f"configuration {d.get('configuration')}")
    else:
        check("unknown collector 'bogus'" in (d.get("error") or ""), f"error {d.get('error')}")
        check(any(r["body"]["step"] == "inventory-collected" and r["body"]["level"] == "error" for r in events), "no error-level inventory-collected event")
        check(len(nexts) == 2, f"want a wait then a poweroff, got {len(nexts)} /next calls")
        want_lldp = [[1, "04020000aabbcc"], [2, "0573777037"], [3, "0078"], [5, b"pdkrd-switch".hex()]]
        check(nics and nics[0].get("lldp") == want_lldp, f"lldp {nics[0].get('lldp') if nics else None} != {want_lldp}")
for s in ["booted", "network-up", "inventory-collected", "inventory-posted", "poweroff"]:
    check(s in steps, f"no {s} event (got {steps})")
check(all(e["body"].get("mac") == mac for e in events), "an event without the boot MAC")
def at(path, step=None):
    for r in recs:
        if r["path"] == path and (step is None or r["body"]["step"] == step):
            return round(r["t"] - start, 1)
print(f"  [{name}] timings (s from qemu start): booted event {at('/api/v1/agent/events', 'booted')}, "
      f"network-up {at('/api/v1/agent/events', 'network-up')}, /v1/continue {at('/v1/continue')}, "
      f"poweroff event {at('/api/v1/agent/events', 'poweroff')}, qemu exit {round(end - start, 1)}")
if problems:
    print(f"  [{name}] FAILED:\n    " + "\n    ".join(problems))
    sys.exit(1)
print(f"  [{name}] OK: {len(steps)} events, inventory matches the VM, powered off")
PY
}

boot normal ""
if [ -z "${PDKRD_ONLY:-}" ]; then
    # A "switch" sending LLDP every second into the VM's tap.
    cat > "$WORK/lldp.py" <<'PY'
import socket, sys, time
def tlv(t, v):
    return ((t << 9) | len(v)).to_bytes(2, "big") + v
src = bytes.fromhex("020000aabbcc")
frame = (bytes.fromhex("0180c200000e") + src + b"\x88\xcc" + tlv(1, b"\x04" + src) + tlv(2, b"\x05swp7")
         + tlv(3, b"\x00\x78") + tlv(5, b"pdkrd-switch") + tlv(0, b""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
while True:
    try:
        s.send(frame)
    except OSError:
        pass  # no VM on the tap yet
    time.sleep(1)
PY
    ip netns exec "$NS" python3 "$WORK/lldp.py" "$TAP" </dev/null >"$WORK/lldp.log" 2>&1 &
    PIDS+=($!)
    nsx python3 -c "import urllib.request as u;u.urlopen(u.Request('http://$SERVER_IP:$PORT/control/wait',data=b'{\"n\":1}',method='POST'))"
    boot bad-collector "paddock.collectors=default,bogus paddock.log=debug paddock.lldp=1 paddock.lldp_timeout=5"
fi
OK=1
echo "qemu-smoke: PASS"
