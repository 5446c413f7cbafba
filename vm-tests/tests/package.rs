//! The appliance installed as an operator installs it, inside a VM: the bootable Debian 12
//! test image boots under QEMU with the package (`target/debian/paddock_*.deb`, from
//! `scripts/build-deb.sh`) and the Debian packages it depends on beside it on a shared
//! directory; a first-boot unit types what the README's Install section says (`dpkg -i`,
//! `paddock init`, `systemctl start paddock`); a second VM on the same bridge PXE-boots
//! through it and is enrolled; then `systemctl stop paddock` must drain cleanly, removing the
//! package must keep the appliance's state and purging it must delete it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paddock_vm_tests::{
    Artifacts, VmSite, VmSpec, bridge_namespace, keep_or_remove, node_with_mac, reap,
    remove_namespace, sh, sh_ok, start_vm, unique_tag,
};

const APPLIANCE_MAC: &str = "52:54:00:ad:00:01";
const MACHINE_MAC: &str = "52:54:00:ad:00:02";
/// The harness's own address on the lab's bridge; the appliance VM is 198.18.0.1.
const HARNESS_IP: &str = "198.18.0.2";
const API: &str = "https://198.18.0.1:8443";

/// What the operator does on the new host, run once at its first boot. Its lines reach the
/// serial console (`OPERATOR: …`), where the harness reads them.
const OPERATOR: &str = r#"#!/bin/sh
set -eu
say() { echo "OPERATOR: $*"; }
trap 'say "failed at line $LINENO"' EXIT
modprobe 9pnet_virtio
mkdir -p /mnt/lab
mount -t 9p -o trans=virtio,version=9p2000.L lab /mnt/lab
iface=""
for d in /sys/class/net/*; do
    [ "$(cat "$d/address")" = "52:54:00:ad:00:01" ] && iface=$(basename "$d")
done
say "installing on $iface"
dpkg -i /mnt/lab/debs/*.deb > /mnt/lab/out/dpkg.log 2>&1
paddock init --interface "$iface" > /mnt/lab/out/init.log 2>&1
systemctl start paddock
pid=$(systemctl show -p MainPID --value paddock)
user=$(stat -c %U "/proc/$pid")
caps=$(awk '/^CapEff/ { print $2 }' "/proc/$pid/status")
cp /var/lib/paddock/certs/ca.pem /var/lib/paddock/certs/admin.pem \
    /var/lib/paddock/certs/admin.key /mnt/lab/out/
# On the appliance's host the CLI needs no flags: the configuration init wrote names the API.
paddock node list > /mnt/lab/out/cli.log 2>&1 && cli=ok || cli=failed
paddock certs tokens >> /mnt/lab/out/cli.log 2>&1 && certs=ok || certs=failed
say "started user=$user cli=$cli certs=$certs capeff=$caps"
while [ ! -e /mnt/lab/stop ]; do sleep 1; done
t0=$(date +%s%N)
systemctl stop paddock
t1=$(date +%s%N)
journalctl -u paddock --no-pager > /mnt/lab/out/journal.log 2>&1 || true
result=$(systemctl show -p Result --value paddock)
status=$(systemctl show -p ExecMainStatus --value paddock)
say "stopped result=$result status=$status ms=$(( (t1 - t0) / 1000000 ))"
# Removing the package keeps the appliance's state and configuration; purging deletes them.
dpkg -r paddock > /mnt/lab/out/remove.log 2>&1
kept=no
[ -s /var/lib/paddock/store.db ] && [ -s /etc/paddock/paddock.toml ] && kept=yes
dpkg -P paddock >> /mnt/lab/out/remove.log 2>&1
purged=no
[ ! -e /var/lib/paddock ] && [ ! -e /etc/paddock/paddock.toml ] && purged=yes
trap - EXIT
say "removed kept=$kept purged=$purged"
"#;

const OPERATOR_UNIT: &str = "[Unit]
Description=The lab's operator: install Paddock, init, start
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/paddock-lab-operator
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
";

/// The static address an operator gives the provisioning interface.
const NETWORK: &str = "[Match]
MACAddress=52:54:00:ad:00:01

[Network]
Address=198.18.0.1/24
";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn the_deb() -> PathBuf {
    let dir = root().join("target/debian");
    std::fs::read_dir(&dir)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("no package in {}: run scripts/build-deb.sh", dir.display()))
}

/// The names a `Depends:` field asks for: each entry's alternatives, in order.
fn alternatives(field: &str) -> Vec<Vec<String>> {
    field
        .split(',')
        .map(|entry| {
            entry
                .split('|')
                .filter_map(|alt| alt.split_whitespace().next())
                .map(|name| name.split(':').next().unwrap_or(name).to_string())
                .collect()
        })
        .filter(|alts: &Vec<String>| !alts.is_empty())
        .collect()
}

/// The package's dependencies (and theirs) that the test image lacks, downloaded from the
/// mirror apt uses, as `apt install ./paddock_*.deb` would fetch them: an entry already
/// satisfied by an installed package (or what it provides) is skipped, otherwise its first
/// alternative is taken, as apt does.
fn dependencies(deb: &Path, image: &Path, into: &Path) -> Vec<String> {
    let status = std::fs::read_to_string(image.join("var/lib/dpkg/status")).unwrap();
    let mut have: std::collections::BTreeSet<String> = Default::default();
    for para in status.split("\n\n") {
        if !para.contains("Status: install ok installed") {
            continue;
        }
        for line in para.lines() {
            if let Some(p) = line.strip_prefix("Package: ") {
                have.insert(p.trim().to_string());
            }
            if let Some(p) = line.strip_prefix("Provides: ") {
                have.extend(alternatives(p).into_iter().flatten());
            }
        }
    }
    let field = |what: &str, name: &str| -> String {
        let text = sh_ok(&format!("apt-cache show --no-all-versions {name}")).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix(what))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut queue = alternatives(
        &sh_ok(&format!(
            "dpkg-deb -f {} Depends Pre-Depends",
            deb.display()
        ))
        .unwrap()
        .lines()
        .map(|l| l.split_once(": ").map_or(l, |(_, v)| v))
        .collect::<Vec<_>>()
        .join(","),
    );
    let mut take = Vec::new();
    while let Some(alts) = queue.pop() {
        if alts.iter().any(|a| have.contains(a)) {
            continue;
        }
        let name = alts[0].clone();
        have.insert(name.clone());
        for p in alternatives(&field("Provides: ", &name))
            .into_iter()
            .flatten()
        {
            have.insert(p);
        }
        queue.extend(alternatives(&field("Depends: ", &name)));
        queue.extend(alternatives(&field("Pre-Depends: ", &name)));
        take.push(name);
    }
    take.sort();
    if !take.is_empty() {
        sh_ok(&format!(
            "cd {} && apt-get download -q {}",
            into.display(),
            take.join(" ")
        ))
        .unwrap();
    }
    take
}

/// A disk holding the bootable image with the operator's first-boot unit and static address.
fn appliance_disk(dir: &Path, image: &Path) -> PathBuf {
    let tree = dir.join("root");
    sh_ok(&format!("cp -a {}/. {}/", image.display(), {
        std::fs::create_dir_all(&tree).unwrap();
        tree.display()
    }))
    .unwrap();
    let write = |rel: &str, text: &str| {
        let p = tree.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let _ = std::fs::remove_file(tree.join("etc/systemd/network/50-paddock-dhcp.network"));
    write("etc/systemd/network/10-lab.network", NETWORK);
    // No EFI system partition here: the kernel is booted directly.
    write(
        "etc/fstab",
        "LABEL=paddock-root / ext4 errors=remount-ro 0 1\n",
    );
    write("usr/local/sbin/paddock-lab-operator", OPERATOR);
    sh_ok(&format!(
        "chmod 0755 {}",
        tree.join("usr/local/sbin/paddock-lab-operator").display()
    ))
    .unwrap();
    write(
        "etc/systemd/system/paddock-lab-operator.service",
        OPERATOR_UNIT,
    );
    let wants = tree.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink(
        "/etc/systemd/system/paddock-lab-operator.service",
        wants.join("paddock-lab-operator.service"),
    )
    .unwrap();
    let disk = dir.join("disk.img");
    sh_ok(&format!(
        "truncate -s 3G {d} && mkfs.ext4 -q -L paddock-root -d {t} {d} && rm -rf {t}",
        d = disk.display(),
        t = tree.display()
    ))
    .unwrap();
    disk
}

struct Vms(Vec<Child>, String, PathBuf, bool);

impl Drop for Vms {
    fn drop(&mut self) {
        for c in &mut self.0 {
            reap(c);
        }
        remove_namespace(&self.1);
        keep_or_remove("package lab", &self.2, self.3 || std::thread::panicking());
    }
}

fn wait_console(console: &Path, want: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text =
            String::from_utf8_lossy(&std::fs::read(console).unwrap_or_default()).into_owned();
        if let Some(line) = text.lines().find(|l| l.contains(want)) {
            return line.to_string();
        }
        if let Some(l) = text.lines().find(|l| l.contains("OPERATOR: failed")) {
            panic!(
                "{l}\n--- console (tail) ---\n{}",
                paddock_vm_tests::tail(&text, 4000)
            );
        }
        assert!(
            Instant::now() < deadline,
            "no {want:?} on {} within {timeout:?}:\n{}",
            console.display(),
            paddock_vm_tests::tail(&text, 4000)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn the_package_installed_in_a_vm_enrols_a_machine_and_stops_cleanly() {
    let artifacts =
        Artifacts::from_env().unwrap_or_else(|e| panic!("VM scenarios cannot run: {e:#}"));
    let image = root().join("target/images/bootable");
    assert!(
        image.join("boot").is_dir(),
        "{} is missing: run scripts/test-images.sh",
        image.display()
    );
    let deb = the_deb();
    let tag = unique_tag("pdkp");
    let ns = tag.clone();
    let dir = std::env::temp_dir().join(format!("paddock-lab-{ns}"));
    let _ = std::fs::remove_dir_all(&dir);
    let share = dir.join("share");
    for d in ["debs", "out"] {
        std::fs::create_dir_all(share.join(d)).unwrap();
    }
    bridge_namespace(&ns, HARNESS_IP).unwrap();
    let mut vms = Vms(Vec::new(), ns.clone(), dir.clone(), false);

    let fetched = dependencies(&deb, &image, &share.join("debs"));
    std::fs::copy(&deb, share.join("debs").join(deb.file_name().unwrap())).unwrap();
    eprintln!(
        "package: installing with {} dependencies: {}",
        fetched.len(),
        fetched.join(" ")
    );
    let disk = appliance_disk(&dir, &image);
    let kernel = sh_ok(&format!("ls {}/boot/vmlinuz-*", image.display())).unwrap();
    let initrd = sh_ok(&format!("ls {}/boot/initrd.img-*", image.display())).unwrap();
    let tap = format!("{tag}a");
    sh_ok(&format!(
        "ip -n {ns} tuntap add dev {tap} mode tap && ip -n {ns} link set {tap} master br0 && \
         ip -n {ns} link set {tap} up"
    ))
    .unwrap();
    let console = dir.join("appliance-console.log");
    let powered = Instant::now();
    let qemu = Command::new("ip")
        .args(["netns", "exec", &ns, "qemu-system-x86_64", "-accel", "tcg"])
        .args(["-cpu", "qemu64,+rdrand", "-m", "1536", "-smp", "2"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-kernel", kernel.trim(), "-initrd", initrd.trim()])
        .args(["-append", "root=LABEL=paddock-root rw console=ttyS0"])
        .arg("-drive")
        .arg(format!("file={},if=virtio,format=raw", disk.display()))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=lab,security_model=none,id=lab",
            share.display()
        ))
        .arg("-netdev")
        .arg(format!("tap,id=n0,ifname={tap},script=no,downscript=no"))
        .arg("-device")
        .arg(format!(
            "virtio-net-pci,netdev=n0,mac={APPLIANCE_MAC},romfile="
        ))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("appliance-qemu.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("appliance-qemu.err")).unwrap())
        .spawn()
        .expect("qemu-system-x86_64");
    vms.0.push(qemu);

    let started = wait_console(&console, "OPERATOR: started", Duration::from_secs(1200));
    eprintln!(
        "package: appliance VM up and serving in {:.0?}: {started}",
        powered.elapsed()
    );
    // As the paddock user, with the unit's three capabilities and no others.
    assert!(started.contains("user=paddock"), "{started}");
    assert!(
        started.contains("cli=ok certs=ok"),
        "{started}: the CLI without flags: {}",
        std::fs::read_to_string(share.join("out/cli.log")).unwrap_or_default()
    );
    let caps = started
        .split("capeff=")
        .nth(1)
        .and_then(|c| u64::from_str_radix(c.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no capabilities in {started}"));
    const NET_BIND_SERVICE: u64 = 1 << 10;
    const NET_ADMIN: u64 = 1 << 12;
    const NET_RAW: u64 = 1 << 13;
    assert_eq!(caps, NET_BIND_SERVICE | NET_ADMIN | NET_RAW, "{started}");

    // A machine on the same bridge PXE-boots through it and is enrolled.
    let site = VmSite {
        ns: &ns,
        tag: &tag,
        dir: &dir,
        artifacts: &artifacts,
    };
    let mut machine = start_vm(&site, 1, VmSpec::bios("machine", MACHINE_MAC), 0).unwrap();
    let out = share.join("out");
    let curl = format!(
        "curl -sf -m 20 --cacert {o}/ca.pem --cert {o}/admin.pem --key {o}/admin.key {API}/api/v1/nodes",
        o = out.display()
    );
    let deadline = Instant::now() + Duration::from_secs(900);
    let node = loop {
        if let Ok(o) = sh(&format!("ip netns exec {ns} {curl}"))
            && o.status.success()
            && let Ok(nodes) = serde_json::from_slice::<serde_json::Value>(&o.stdout)
            && let Some(n) = node_with_mac(&nodes, MACHINE_MAC)
            && n["introspection"]["state"].as_str() == Some("finished")
        {
            break n.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the machine did not enrol\n--- machine console ---\n{}\n--- appliance console ---\n{}",
            paddock_vm_tests::tail(&machine.console_text(), 3000),
            paddock_vm_tests::tail(
                &String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()),
                3000
            )
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    eprintln!(
        "package: machine enrolled through the packaged appliance in {:.0?}: node {}",
        machine.powered_on.elapsed(),
        node["uuid"]
    );
    machine.power_off();

    // `systemctl stop`: SIGTERM, the drain, a clean exit within the unit's stop timeout.
    std::fs::write(share.join("stop"), "").unwrap();
    let stopped = wait_console(&console, "OPERATOR: stopped", Duration::from_secs(180));
    eprintln!("package: {stopped}");
    assert!(
        stopped.contains("result=success status=0"),
        "{stopped}\n{}",
        std::fs::read_to_string(out.join("journal.log")).unwrap_or_default()
    );
    let journal = std::fs::read_to_string(out.join("journal.log")).unwrap_or_default();
    assert!(journal.contains("SIGTERM: shutting down"), "{journal}");
    // `apt remove` keeps the store and the configuration; `apt purge` deletes them.
    let removed = wait_console(&console, "OPERATOR: removed", Duration::from_secs(120));
    eprintln!("package: {removed}");
    assert!(removed.contains("kept=yes purged=yes"), "{removed}");
    vms.3 = std::env::var_os("PADDOCK_KEEP_LAB").is_some();
}
