#!/usr/bin/env bash
# BMC emulators for the power drivers' tests (power/tests/bmc.rs): one TCG libvirt domain on a
# bridge in a network namespace this script creates and removes, with sushy-tools' Redfish
# emulator (plain HTTP, and HTTPS with a certificate from a test CA) and virtualbmc (IPMI
# lanplus) in front of it: the setup Metal3 and Ironic test with. Also ten machines on
# sushy-tools' fake driver (power as state, no VMs) for the power-on throttle.
#
#   scripts/bmc-harness.sh venv          builds (once) the pinned venv, prints its bin directory
#   scripts/bmc-harness.sh run NS DIR    sets everything up in namespace NS (scratch in DIR),
#                                        prints `ready KEY=VALUE…`, answers `virsh ARGS` lines
#                                        (output as `| …` lines, then `end STATUS`), and when
#                                        its stdin closes (the test ended, however it ended)
#                                        stops everything it started and removes NS
#
# Everything runs inside NS and a private mount namespace: libvirtd and virtlogd are started by
# hand (`-d`; no systemd) with their own copies of /etc/libvirt, /run/libvirt, /var/lib/libvirt,
# /var/log/libvirt and /var/cache/libvirt bound over the real ones, so the host's libvirt is
# never touched and nothing leaves the namespace. Addresses: 198.19.60.0/24 (in 198.18.0.0/15).
# The venv (Debian's python3 with --system-site-packages, for python3-libvirt; sushy-tools and
# virtualbmc from the Python package registry, pinned) is cached in $PADDOCK_CACHE/bmc-venv.
# Needs root and scripts/install-deps.sh.
set -euo pipefail
SELF=$(realpath "$0")
PADDOCK_CACHE=${PADDOCK_CACHE:-/var/cache/paddock}
VENV=${BMC_VENV:-$PADDOCK_CACHE/bmc-venv}
PINS=(sushy-tools==2.2.0 virtualbmc==3.3.0 pyghmi==1.6.19 Flask==3.1.3 bcrypt==5.0.0)
NET=198.19.60
BRIDGE_IP=$NET.1
DOMAIN=paddock-bmc-vm
MAC=52:54:00:19:60:10
USER_NAME=admin
PASSWORD=paddock-bmc-secret
HTTP_PORT=8000
HTTPS_PORT=8443
IPMI_PORT=6230
FAKE_PORT=8001
FAKE_SYSTEMS=10
fake_uuid() { printf '0f000000-0000-4000-8000-%012d' "$1"; }

die() { echo "bmc-harness: $*" >&2; exit 1; }

venv() {
  local stamp="$VENV/.paddock-pins"
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
  if [[ ! -x $VENV/bin/sushy-emulator || ! -x $VENV/bin/vbmcd || "$(cat "$stamp" 2>/dev/null)" != "${PINS[*]}" ]]; then
    [[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 missing: run scripts/install-deps.sh"
    /usr/bin/python3 -c 'import libvirt' 2>/dev/null || die "python3-libvirt missing: run scripts/install-deps.sh"
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV" \
      || die "python3 -m venv failed: run scripts/install-deps.sh (python3-venv)"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
    echo "${PINS[*]}" >"$stamp"
  fi
  flock -u 9
  echo "$VENV/bin"
}

DIR=
PIDS=()
# Stops what inner started (by the ids it recorded), the domain first.
teardown() {
  set +e
  local f p i live
  if [[ -S $DIR/run/libvirt-sock ]]; then
    virsh -q destroy "$DOMAIN" >/dev/null 2>&1
    virsh -q undefine "$DOMAIN" >/dev/null 2>&1
  fi
  for f in "$DIR"/pids/*.pid; do [[ -s $f ]] && PIDS+=("$(cat "$f")"); done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for ((i = 0; i < 50; i++)); do
    live=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && live=1; done
    ((live)) || break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -9 "$p"; done
  wait 2>/dev/null
}

# The part that runs inside the namespaces: set up, announce, hold, tear down.
inner() {
  DIR=$1
  local dir=$1 bin=$2 t
  for t in libvirtd virtlogd virsh qemu-system-x86_64 qemu-img ipmitool openssl curl; do
    command -v "$t" >/dev/null || die "$t missing: run scripts/install-deps.sh"
  done
  trap teardown EXIT
  trap 'exit 143' TERM INT

  mkdir -p "$dir"/{etc,run,lib,log,cache,pids,home,vm}
  cp -a /etc/libvirt/. "$dir/etc/"
  rm -f "$dir/etc/qemu/networks/autostart/"* "$dir/etc/qemu/"*.xml
  cat >>"$dir/etc/qemu.conf" <<EOF
user = "root"
group = "root"
security_driver = "none"
EOF
  mount --bind "$dir/etc" /etc/libvirt
  mount --bind "$dir/run" /run/libvirt 2>/dev/null || { mkdir -p /run/libvirt && mount --bind "$dir/run" /run/libvirt; }
  mount --bind "$dir/lib" /var/lib/libvirt
  mount --bind "$dir/log" /var/log/libvirt
  mkdir -p /var/cache/libvirt && mount --bind "$dir/cache" /var/cache/libvirt

  ip link set lo up
  ip link add br0 type bridge
  ip addr add "$BRIDGE_IP/24" dev br0
  ip link set br0 up

  virtlogd -d -p "$dir/pids/virtlogd.pid"
  libvirtd -d -p "$dir/pids/libvirtd.pid"
  for _ in $(seq 100); do virsh -q uri >/dev/null 2>&1 && break; sleep 0.1; done
  virsh -q uri >/dev/null 2>&1 || die "libvirtd did not answer (log: $dir/log)"

  qemu-img create -q -f qcow2 "$dir/vm/disk.qcow2" 64M
  cat >"$dir/vm/domain.xml" <<EOF
<domain type='qemu'>
  <name>$DOMAIN</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$dir/vm/disk.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <source bridge='br0'/>
      <mac address='$MAC'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='$dir/vm/console.log'/></serial>
  </devices>
</domain>
EOF
  virsh -q define "$dir/vm/domain.xml" >/dev/null
  # Kept as defined (with its UUID), so that `virsh define` of it puts the domain back.
  virsh dumpxml --inactive "$DOMAIN" >"$dir/vm/domain.xml"
  local uuid
  uuid=$(virsh domuuid "$DOMAIN")
  uuid=${uuid%%[[:space:]]*}

  # Redfish: sushy-tools with basic auth (bcrypt htpasswd: the only kind it accepts).
  "$bin/python3" -c 'import bcrypt, sys; print(sys.argv[1] + ":" + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(rounds=4)).decode())' \
    "$USER_NAME" "$PASSWORD" >"$dir/htpasswd"
  # A CA of the test's own and the emulator's certificate signed by it (rustls, like any
  # webpki verifier, refuses a CA certificate used as the server's own).
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=paddock-bmc-test-ca" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$BRIDGE_IP" -keyout "$dir/tls.key" \
    -out "$dir/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$BRIDGE_IP" >"$dir/tls.ext"
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 2 -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
  # sushy-tools keeps state (the fake machines' power …) in sqlite files under $TMPDIR: this
  # run's own.
  mkdir -p "$dir/tmp"
  export TMPDIR=$dir/tmp
  cat >"$dir/sushy.conf" <<EOF
SUSHY_EMULATOR_AUTH_FILE = '$dir/htpasswd'
SUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'
EOF
  "$bin/sushy-emulator" --config "$dir/sushy.conf" -i "$BRIDGE_IP" -p "$HTTP_PORT" \
    >"$dir/sushy-http.log" 2>&1 &
  PIDS+=($!)
  "$bin/sushy-emulator" --config "$dir/sushy.conf" -i "$BRIDGE_IP" -p "$HTTPS_PORT" \
    --ssl-certificate "$dir/tls.crt" --ssl-key "$dir/tls.key" >"$dir/sushy-https.log" 2>&1 &
  PIDS+=($!)

  # Ten more machines for the power-on throttle, on sushy-tools' fake driver (no VMs: their
  # power is a state in the emulator, which logs every Reset it gets with its time).
  {
    echo "SUSHY_EMULATOR_AUTH_FILE = '$dir/htpasswd'"
    echo "SUSHY_EMULATOR_FAKE_DRIVER = True"
    echo "SUSHY_EMULATOR_FAKE_SYSTEMS = ["
    for i in $(seq 0 $((FAKE_SYSTEMS - 1))); do
      printf "  {'uuid': '%s', 'name': 'fake-%d', 'power_state': 'Off', 'nics': [{'mac': '52:54:00:19:61:%02x', 'ip': '$NET.%d'}]},\n" \
        "$(fake_uuid "$i")" "$i" "$i" $((100 + i))
    done
    echo "]"
  } >"$dir/sushy-fake.conf"
  "$bin/sushy-emulator" --config "$dir/sushy-fake.conf" -i "$BRIDGE_IP" -p "$FAKE_PORT" \
    >"$dir/sushy-fake.log" 2>&1 &
  PIDS+=($!)

  # IPMI: virtualbmc (vbmcd keeps its state under $HOME/.vbmc).
  export HOME=$dir/home
  "$bin/vbmcd" --foreground >"$dir/vbmcd.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do "$bin/vbmc" list >/dev/null 2>&1 && break; sleep 0.1; done
  "$bin/vbmc" add "$DOMAIN" --address "$BRIDGE_IP" --port "$IPMI_PORT" --username "$USER_NAME" \
    --password "$PASSWORD" --libvirt-uri qemu:///system >/dev/null
  "$bin/vbmc" start "$DOMAIN" >/dev/null

  # Ready when both answer.
  local ok=0
  for _ in $(seq 150); do
    if curl -sf -u "$USER_NAME:$PASSWORD" "http://$BRIDGE_IP:$HTTP_PORT/redfish/v1/Systems" >/dev/null &&
      curl -sfk -u "$USER_NAME:$PASSWORD" "https://$BRIDGE_IP:$HTTPS_PORT/redfish/v1/Systems" >/dev/null &&
      curl -sf -u "$USER_NAME:$PASSWORD" "http://$BRIDGE_IP:$FAKE_PORT/redfish/v1/Systems" >/dev/null &&
      IPMI_PASSWORD=$PASSWORD ipmitool -I lanplus -H "$BRIDGE_IP" -p "$IPMI_PORT" -U "$USER_NAME" -E \
        -N 1 -R 1 power status >/dev/null 2>&1; then
      ok=1
      break
    fi
    sleep 0.2
  done
  ((ok)) || die "the emulators did not answer (logs in $dir)"
  echo "ready domain=$DOMAIN uuid=$uuid mac=$MAC ip=$BRIDGE_IP user=$USER_NAME password=$PASSWORD" \
    "http=$HTTP_PORT https=$HTTPS_PORT ipmi=$IPMI_PORT ca=$dir/ca.crt" \
    "fake=$FAKE_PORT fakes=$FAKE_SYSTEMS fakelog=$dir/sushy-fake.log"
  # Hold until the test closes our stdin (also when it dies) or stops us.
  while read -r line; do
    case $line in
      # `virsh ARGS…` on request, for the test to check what the emulators did to the domain.
      virsh\ *)
        read -ra args <<<"${line#virsh }"
        rc=0
        out=$(virsh "${args[@]}" 2>&1) || rc=$?
        sed 's/^/| /' <<<"$out"
        echo "end $rc"
        ;;
      *) echo "end 2" ;;
    esac
  done
}

case ${1:-} in
  venv) venv ;;
  run)
    [[ $# -eq 3 ]] || die "usage: $0 run NAMESPACE SCRATCH_DIR"
    [[ $EUID -eq 0 ]] || die "run as root (namespaces, libvirtd)"
    ns=$2 dir=$(realpath -m "$3")
    bin=$(venv)
    mkdir -p "$dir"
    ip netns add "$ns" || die "could not create namespace $ns"
    trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
    # Not exec: the namespace goes when the inner part ends, however it ends.
    ip netns exec "$ns" unshare --mount --propagation private bash ${BMC_HARNESS_TRACE:+-x} "$SELF" inner "$dir" "$bin" || exit $?
    ;;
  inner) inner "$2" "$3" ;;
  *) die "usage: $0 venv | run NAMESPACE SCRATCH_DIR" ;;
esac
