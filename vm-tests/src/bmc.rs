//! BMCs for VM scenarios: in a [`crate::Lab`]'s namespace, a libvirt TCG domain whose NIC is
//! on the lab's bridge (so it PXE-boots from the appliance through iPXE, as the lab's QEMU
//! VMs do), with sushy-tools' Redfish emulator and virtualbmc (IPMI) in front of it, on the
//! appliance's own address (`198.18.0.1`, ports [`REDFISH_PORT`] and [`IPMI_PORT`]).
//!
//! libvirtd and virtlogd run by hand (`-d`; no systemd) inside the lab's network namespace and
//! a private mount namespace, with their own copies of `/etc/libvirt`, `/run/libvirt`,
//! `/var/lib/libvirt`, `/var/log/libvirt` and `/var/cache/libvirt` bound over the real ones,
//! so the host's libvirt is never touched, as `scripts/bmc-harness.sh` does for the power
//! crate's tests (its venv, built by `scripts/bmc-harness.sh venv`, is reused). The setup
//! script is this file's own text with test-made values only. It answers `virsh ARGS` lines
//! (output as `| …` lines, then `end STATUS`), and when its stdin closes (the test ended,
//! however it ended) it destroys the domain and stops what it started; the lab's drop then
//! kills whatever is left in the namespace.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{Lab, SERVER_IP};

pub const REDFISH_PORT: u16 = 8000;
pub const IPMI_PORT: u16 = 6230;
pub const USER: &str = "admin";
/// At most 20 characters: IPMI v2 passwords are no longer.
pub const PASSWORD: &str = "paddock-vm-secret";

/// The domain: its name, NIC MAC, memory and disk.
#[derive(Clone, Debug)]
pub struct Domain {
    pub name: String,
    pub mac: String,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// A libvirt domain with a Redfish and an IPMI BMC, in a lab's namespace.
pub struct Bmcs {
    pub domain: Domain,
    /// The domain's UUID (the Redfish System's id).
    pub uuid: String,
    pub dir: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

const SCRIPT: &str = r#"set -euo pipefail
dir=$1 bin=$2 name=$3 mac=$4 mem=$5 disk=$6 ip=$7 rport=$8 iport=$9 user=${10} pass=${11}
PIDS=()
teardown() {
  set +e
  if [[ -S $dir/run/libvirt-sock ]]; then
    virsh -q destroy "$name" >/dev/null 2>&1
    virsh -q undefine "$name" >/dev/null 2>&1
  fi
  for f in "$dir"/pids/*.pid; do [[ -s $f ]] && PIDS+=("$(cat "$f")"); done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -9 "$p"; done
  wait 2>/dev/null
}
trap teardown EXIT
trap 'exit 143' TERM INT
mkdir -p "$dir"/{etc,run,lib,log,cache,pids,home,vm,tmp}
cp -a /etc/libvirt/. "$dir/etc/"
rm -f "$dir/etc/qemu/networks/autostart/"* "$dir/etc/qemu/"*.xml
printf 'user = "root"\ngroup = "root"\nsecurity_driver = "none"\n' >>"$dir/etc/qemu.conf"
mount --bind "$dir/etc" /etc/libvirt
mkdir -p /run/libvirt /var/cache/libvirt
mount --bind "$dir/run" /run/libvirt
mount --bind "$dir/lib" /var/lib/libvirt
mount --bind "$dir/log" /var/log/libvirt
mount --bind "$dir/cache" /var/cache/libvirt
virtlogd -d -p "$dir/pids/virtlogd.pid"
libvirtd -d -p "$dir/pids/libvirtd.pid"
for _ in $(seq 100); do virsh -q uri >/dev/null 2>&1 && break; sleep 0.1; done
qemu-img create -q -f qcow2 "$dir/vm/disk.qcow2" "${disk}M"
cat >"$dir/vm/domain.xml" <<EOF
<domain type='qemu'>
  <name>$name</name>
  <memory unit='MiB'>$mem</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$dir/vm/disk.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <source bridge='br0'/>
      <mac address='$mac'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='$dir/vm/console.log'/></serial>
  </devices>
</domain>
EOF
virsh -q define "$dir/vm/domain.xml" >/dev/null
uuid=$(virsh domuuid "$name")
uuid=${uuid%%[[:space:]]*}
"$bin/python3" -c 'import bcrypt, sys; print(sys.argv[1] + ":" + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(rounds=4)).decode())' \
  "$user" "$pass" >"$dir/htpasswd"
export TMPDIR=$dir/tmp
printf "SUSHY_EMULATOR_AUTH_FILE = '%s'\nSUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'\n" "$dir/htpasswd" >"$dir/sushy.conf"
"$bin/sushy-emulator" --config "$dir/sushy.conf" -i "$ip" -p "$rport" >"$dir/sushy.log" 2>&1 &
PIDS+=($!)
export HOME=$dir/home
"$bin/vbmcd" --foreground >"$dir/vbmcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do "$bin/vbmc" list >/dev/null 2>&1 && break; sleep 0.1; done
"$bin/vbmc" add "$name" --address "$ip" --port "$iport" --username "$user" --password "$pass" \
  --libvirt-uri qemu:///system >/dev/null
"$bin/vbmc" start "$name" >/dev/null
ok=0
for _ in $(seq 150); do
  if curl -sf -u "$user:$pass" "http://$ip:$rport/redfish/v1/Systems" >/dev/null &&
    IPMI_PASSWORD=$pass ipmitool -I lanplus -H "$ip" -p "$iport" -U "$user" -E -N 1 -R 1 power status >/dev/null 2>&1; then
    ok=1
    break
  fi
  sleep 0.2
done
((ok)) || { echo "bmc: the emulators did not answer (logs in $dir)" >&2; exit 1; }
echo "ready uuid=$uuid"
while read -r line; do
  case $line in
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
"#;

impl Bmcs {
    /// Defines `domain` (shut off, booting from its blank disk) in `lab`'s namespace and
    /// starts its BMCs; ready when both answer.
    pub fn start(lab: &Lab, domain: Domain) -> anyhow::Result<Bmcs> {
        let venv = Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../scripts/bmc-harness.sh"
            ))
            .arg("venv")
            .output()
            .context("scripts/bmc-harness.sh venv")?;
        if !venv.status.success() {
            bail!(
                "scripts/bmc-harness.sh venv failed: {}",
                String::from_utf8_lossy(&venv.stderr)
            );
        }
        let bin = String::from_utf8_lossy(&venv.stdout).trim().to_string();
        let dir = lab.dir.join("bmc");
        std::fs::create_dir_all(&dir)?;
        let script = dir.join("bmc.sh");
        std::fs::write(&script, SCRIPT)?;
        let started = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &lab.ns])
            .args(["unshare", "--mount", "--propagation", "private", "bash"])
            .arg(&script)
            .arg(&dir)
            .arg(&bin)
            .args([&domain.name, &domain.mac])
            .arg(domain.memory_mb.to_string())
            .arg(domain.disk_mb.to_string())
            .arg(SERVER_IP)
            .arg(REDFISH_PORT.to_string())
            .arg(IPMI_PORT.to_string())
            .args([USER, PASSWORD])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the BMC emulators")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let Some(rest) = line.trim().strip_prefix("ready ") else {
            let status = child.wait()?;
            bail!("the BMC emulators did not start ({status}); they said {line:?}");
        };
        let info: HashMap<&str, &str> = rest
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let uuid = info.get("uuid").context("no domain uuid")?.to_string();
        eprintln!(
            "BMCs (Redfish, IPMI) of domain {} ready in {:.1} s",
            domain.name,
            started.elapsed().as_secs_f64()
        );
        Ok(Bmcs {
            domain,
            uuid,
            dir,
            child,
            stdin,
            stdout,
        })
    }

    /// `virsh ARGS` (test-made words) inside the namespaces: exit status and output.
    pub fn virsh(&mut self, args: &str) -> anyhow::Result<(i32, String)> {
        let stdin = self.stdin.as_mut().context("the emulators stopped")?;
        writeln!(stdin, "virsh {args}")?;
        stdin.flush()?;
        let mut out = String::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                bail!("the BMC emulators ended");
            }
            if let Some(rc) = line.trim_end().strip_prefix("end ") {
                return Ok((rc.parse().unwrap_or(-1), out));
            }
            out.push_str(line.strip_prefix("| ").unwrap_or(&line));
        }
    }

    /// The domain's state as libvirt says it (`running`, `shut off` …).
    pub fn domstate(&mut self) -> anyhow::Result<String> {
        let name = self.domain.name.clone();
        let (rc, out) = self.virsh(&format!("domstate {name}"))?;
        if rc != 0 {
            bail!("virsh domstate {name}: {out}");
        }
        Ok(out.trim().to_string())
    }

    /// Waits until the domain is in `state`.
    pub fn wait_state(&mut self, state: &str, timeout: Duration) -> anyhow::Result<Duration> {
        let t = Instant::now();
        loop {
            let now = self.domstate()?;
            if now == state {
                return Ok(t.elapsed());
            }
            if t.elapsed() > timeout {
                bail!(
                    "domain {} still {now}, not {state}, after {timeout:?}; console:\n{}",
                    self.domain.name,
                    crate::tail(&self.console(), 3000)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The domain's serial console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.dir.join("vm/console.log")).unwrap_or_default())
            .into_owned()
    }

    /// The Redfish emulator's access log (every request with its time).
    pub fn redfish_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sushy.log")).unwrap_or_default()
    }

    /// The node's Ironic `driver_info` for the Redfish BMC.
    pub fn redfish_driver_info(&self) -> serde_json::Value {
        serde_json::json!({
            "redfish_address": format!("http://{SERVER_IP}:{REDFISH_PORT}"),
            "redfish_system_id": format!("/redfish/v1/Systems/{}", self.uuid),
            "redfish_username": USER,
            "redfish_password": PASSWORD,
        })
    }

    /// The node's Ironic `driver_info` for the IPMI BMC.
    pub fn ipmi_driver_info(&self) -> serde_json::Value {
        serde_json::json!({
            "ipmi_address": SERVER_IP,
            "ipmi_port": IPMI_PORT,
            "ipmi_username": USER,
            "ipmi_password": PASSWORD,
        })
    }
}

impl Drop for Bmcs {
    fn drop(&mut self) {
        // Closing its stdin makes the script destroy the domain and stop its daemons.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
