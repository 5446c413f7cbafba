//! VM scenarios: real firmware PXE-boots through Paddock into the discovery ramdisk and
//! enrols. Each scenario has its own namespace, bridge and appliance. They need root, QEMU,
//! iPXE, OVMF and the ramdisk (`scripts/build-ramdisk.sh`); `./scripts/test.sh` prepares all.

use std::time::Duration;

use paddock_vm_tests::{Artifacts, BOOT_URL, Creds, Firmware, Lab, VmSpec, curl_in};
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

fn artifacts() -> Artifacts {
    Artifacts::from_env().unwrap_or_else(|e| panic!("VM scenarios cannot run: {e:#}"))
}

/// The inventory the ramdisk reported matches the VM's QEMU configuration exactly.
fn assert_inventory_matches(data: &Value, spec: &VmSpec, boot_mode: &str) {
    let inv = &data["inventory"];
    assert_eq!(
        inv["cpu"]["count"].as_u64(),
        Some(u64::from(spec.cpus)),
        "vCPUs: {}",
        inv["cpu"]
    );
    assert_eq!(
        inv["memory"]["physical_mb"].as_u64(),
        Some(spec.memory_mb),
        "memory: {}",
        inv["memory"]
    );
    let disks: Vec<u64> = inv["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["size"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = spec.disks_mb.iter().map(|m| m * MIB).collect();
    assert_eq!(disks, want, "disk sizes: {}", inv["disks"]);
    let macs: Vec<&str> = inv["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["mac_address"].as_str())
        .collect();
    for m in &spec.macs {
        assert!(macs.contains(&m.as_str()), "NIC {m} missing from {macs:?}");
    }
    // The boot NIC's IPv6 address: the link-local one the kernel forms from its MAC
    // (modified EUI-64), as nothing on the lab's network hands out IPv6 addresses.
    let boot = inv["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["mac_address"] == spec.macs[0].as_str())
        .unwrap();
    assert_eq!(
        boot["ipv6_address"].as_str(),
        Some(eui64_link_local(&spec.macs[0]).as_str()),
        "{boot}"
    );
    assert_eq!(inv["boot"]["current_boot_mode"], boot_mode);
    assert_eq!(inv["boot"]["pxe_interface"], spec.macs[0].as_str());
}

/// The modified EUI-64 link-local address of a MAC (`fe80::5054:ff:fe12:3456` for
/// `52:54:00:12:34:56`).
fn eui64_link_local(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    let text = format!(
        "fe80::{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        b[0] ^ 2,
        b[1],
        b[2],
        b[3],
        b[4],
        b[5]
    );
    let ip: std::net::Ipv6Addr = text.parse().unwrap();
    ip.to_string()
}

/// A namespace of its own on the lab's bridge at 198.18.0.250: another machine of the
/// provisioning network. Removed on drop.
struct Neighbour(String);

impl Neighbour {
    fn join(lab: &Lab) -> Neighbour {
        let ns = format!("{}-nb", lab.ns);
        // Both ends are made inside their namespaces, so plain names cannot clash.
        let (a, b) = ("nbr0", "nb0");
        paddock_vm_tests::sh_ok(&format!(
            "ip netns add {ns} && ip -n {ns} link set lo up && \
             ip link add {a} netns {lab} type veth peer name {b} netns {ns} && \
             ip -n {lab} link set {a} master br0 up && \
             ip -n {ns} addr add 198.18.0.250/24 dev {b} && ip -n {ns} link set {b} up",
            lab = lab.ns
        ))
        .expect("the neighbour's namespace");
        Neighbour(ns)
    }

    fn sh(&self, cmd: &str) -> String {
        paddock_vm_tests::sh_ok(&format!("ip netns exec {} {cmd}", self.0)).unwrap_or_default()
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        paddock_vm_tests::remove_namespace(&self.0);
    }
}

/// The enrolled machine answers by name in the appliance's DNS, asked with dig from another
/// machine of the network: its host name and its UUID name give the address it leased.
fn assert_resolvable(lab: &Lab, node: &Value, data: &Value) {
    let uuid = node["uuid"].as_str().unwrap();
    let name = format!("node-{}", &uuid.replace('-', "")[..8]);
    let pxe = data["inventory"]["boot"]["pxe_interface"].as_str().unwrap();
    let leased = data["inventory"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["mac_address"] == pxe)
        .and_then(|i| i["ipv4_address"].as_str())
        .expect("the PXE interface's address")
        .to_string();
    let neighbour = Neighbour::join(lab);
    let ask = |q: &str| neighbour.sh(&format!("dig @198.18.0.1 +short +time=2 +tries=2 {q}"));
    assert_eq!(ask(&format!("{name}.paddock.internal A")).trim(), leased);
    assert_eq!(
        ask(&format!("{uuid}.node.paddock.internal A")).trim(),
        leased
    );
    assert_eq!(
        ask(&format!("-x {leased}")).trim(),
        format!("{name}.paddock.internal.")
    );
}

/// Whether a node's timeline has an entry of `kind` whose message says `says`.
fn timeline_says(node: &Value, kind: &str, says: &str) -> bool {
    node["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["kind"] == kind && e["message"].as_str().is_some_and(|m| m.contains(says)))
}

fn enrol_one(firmware: Firmware, name: &str, timeout: Duration) {
    let mut lab = Lab::start(name, &artifacts(), "[dns]\nenabled = true\n").expect("lab");
    let spec = VmSpec {
        name: name.into(),
        firmware,
        cpus: 2,
        memory_mb: 512,
        disks_mb: vec![1024, 3072],
        macs: vec![
            format!(
                "52:54:00:{}:00:01",
                if firmware == Firmware::Bios {
                    "b1"
                } else {
                    "e1"
                }
            ),
            format!(
                "52:54:00:{}:00:02",
                if firmware == Firmware::Bios {
                    "b1"
                } else {
                    "e1"
                }
            ),
        ],
        direct: None,
    };
    let vm = lab.boot(spec.clone()).expect("boot VM");
    let (node, took) = lab
        .wait_enrolled(vm, timeout)
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!("{name}: power-on → enrolled {:.1} s", took.as_secs_f64());
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    assert_eq!(node["auto_discovered"], true);
    let data = lab
        .data(node["uuid"].as_str().unwrap())
        .expect("processed data");
    let mode = if firmware == Firmware::Bios {
        "bios"
    } else {
        "uefi"
    };
    assert_inventory_matches(&data, &spec, mode);
    assert_resolvable(&lab, &node, &data);
    // The properties the scheduler hook derived.
    assert_eq!(node["properties"]["cpus"], 2);
    assert_eq!(node["properties"]["memory_mb"], 512);
    // The timeline covers the whole path: DHCP, script, ramdisk, inventory, finished.
    let kinds: Vec<&str> = node["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for k in [
        "dhcp",
        "boot-script",
        "ramdisk-booted",
        "ramdisk-network-up",
        "inventory-received",
        "introspection-finished",
    ] {
        assert!(
            kinds.contains(&k),
            "{k} missing from the timeline {kinds:?}"
        );
    }
    // And then the ramdisk powers the VM off.
    lab.wait_powered_off(vm, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_tls_only(&lab);
}

/// TLS is on: the API is not served on plain HTTP, and HTTPS without a certificate or token
/// is refused; the boot path stays plain.
fn assert_tls_only(lab: &Lab) {
    let ca = lab
        .certs
        .as_ref()
        .expect("the lab runs with TLS")
        .join("ca.pem");
    let (status, body) = curl_in(
        &lab.ns,
        "GET",
        &format!("{BOOT_URL}/api/v1/nodes"),
        None,
        10,
    )
    .expect("curl");
    assert_eq!(status, 403, "the API on plain HTTP: {body}");
    let (status, body) = lab
        .api_as(
            &Creds {
                ca: Some(ca),
                ..Creds::none()
            },
            "GET",
            "/api/v1/nodes",
            None,
        )
        .expect("curl");
    assert_eq!(status, 401, "the API without a certificate: {body}");
    let (status, _) =
        curl_in(&lab.ns, "GET", &format!("{BOOT_URL}/boot/ca.pem"), None, 10).expect("curl");
    assert_eq!(status, 200, "the CA on the boot path");
}

#[test]
fn bios_vm_enrols_with_its_exact_inventory() {
    enrol_one(Firmware::Bios, "bios", Duration::from_secs(240));
}

#[test]
fn uefi_vm_enrols_with_its_exact_inventory() {
    enrol_one(Firmware::Uefi, "uefi", Duration::from_secs(900));
}

/// Secure Boot: two OVMF VMs with Microsoft's keys enrolled. The one in the network that
/// boots signed binaries gets shim → Debian's signed GRUB → its own GRUB configuration →
/// the signed kernel and our initrd, all over TFTP, and is inspected under the kernel's
/// lockdown (signed modules only). The other is given iPXE, as a machine without Secure
/// Boot would be, and its firmware refuses it: the test proves the firmware enforces.
#[test]
fn secure_boot_vm_enrols_through_shim_and_grub() {
    let (signed_mac, ipxe_mac) = ("52:54:00:5b:00:01", "52:54:00:5b:00:02");
    let extra = format!(
        "[boot.secure_boot]\n\
         enabled = true\n\
         networks = [\"198.18.0.16/28\"]\n\
         [[dhcp.reservations]]\n\
         mac = \"{signed_mac}\"\n\
         ip = \"198.18.0.20\"\n\
         [[dhcp.reservations]]\n\
         mac = \"{ipxe_mac}\"\n\
         ip = \"198.18.0.40\"\n"
    );
    let mut lab = Lab::start("sboot", &artifacts(), &extra).expect("lab");
    let vm = |name: &str, mac: &str| VmSpec::provisioning(name, mac, Firmware::UefiSecureBoot);
    let signed = lab.boot(vm("sbsigned", signed_mac)).expect("boot VM");
    let refused = lab.boot(vm("sbipxe", ipxe_mac)).expect("boot VM");
    paddock_vm_tests::wait_for(
        "the firmware refusing unsigned iPXE",
        Duration::from_secs(600),
        || {
            lab.vms[refused]
                .console_text()
                .contains("Access Denied")
                .then_some(())
        },
        || lab.vms[refused].console_text(),
    );
    lab.vms[refused].power_off();
    let (node, took) = lab
        .wait_enrolled(signed, Duration::from_secs(900))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "secure boot: power-on → enrolled {:.1} s",
        took.as_secs_f64()
    );
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    let console = lab.vms[signed].console_text();
    for said in [
        "secureboot: Secure boot enabled",
        "Kernel is locked down from EFI Secure Boot",
    ] {
        assert!(
            console.contains(said),
            "the kernel did not say {said:?}:\n{console}"
        );
    }
    assert!(
        timeline_says(&node, "boot-script", "GRUB configuration served"),
        "no GRUB configuration in the timeline: {node}"
    );
    let data = lab
        .data(node["uuid"].as_str().unwrap())
        .expect("processed data");
    assert_eq!(
        data["inventory"]["boot"]["current_boot_mode"], "uefi",
        "{data}"
    );
}

/// UEFI HTTP boot with TFTP off: the firmware (PXE disabled, HTTP boot alone) asks DHCP as
/// an `HTTPClient`, is given iPXE's URL among the boot assets, and iPXE goes on over HTTP to
/// the discovery ramdisk; no TFTP server is listening.
#[test]
fn uefi_http_boot_vm_enrols_with_tftp_off() {
    let mut lab = Lab::start_prepared("httpb", &artifacts(), "", &Lab::tftp_off).expect("lab");
    let udp = paddock_vm_tests::sh_ok(&format!("ip netns exec {} ss -Hlun", lab.ns)).unwrap();
    assert!(!udp.contains(":69 "), "TFTP is listening: {udp}");
    let vm = lab
        .boot(VmSpec::provisioning(
            "httpb",
            "52:54:00:4b:00:01",
            Firmware::UefiHttp,
        ))
        .expect("boot VM");
    let (node, took) = lab
        .wait_enrolled(vm, Duration::from_secs(900))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!("http boot: power-on → enrolled {:.1} s", took.as_secs_f64());
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    let console = lab.vms[vm].console_text();
    assert!(
        !console.contains("Start PXE"),
        "the firmware tried PXE: {console}"
    );
    let given = format!("boot {BOOT_URL}/boot/assets/ipxe.efi");
    assert!(
        timeline_says(&node, "dhcp", &given),
        "no DHCP answer with {given:?}: {node}"
    );
}

/// An arm64 machine (QEMU's `virt` under TCG, UEFI PXE as client architecture 11) is given
/// Debian's signed arm64 network GRUB over TFTP, which asks for its own configuration by
/// GRUB's CPU and MAC, and boots the arm64 kernel and the aarch64 agent's ramdisk
/// (`scripts/build-ramdisk.sh --arch aarch64`), which inspects it: its inventory matches the
/// VM and says aarch64, and of two rules that pick by architecture only the aarch64 one acts.
#[test]
fn arm64_vm_is_inspected_through_grub() {
    let a = artifacts();
    let arm64 = a.ramdisk_dir.join("aarch64");
    for f in ["grubaa64.efi", "vmlinuz", "initrd.img"] {
        assert!(
            arm64.join(f).is_file(),
            "{} is missing: run scripts/build-ramdisk.sh --arch aarch64",
            arm64.join(f).display()
        );
    }
    let mut lab = Lab::start("arm64", &a, "[boot.arm64]\nenabled = true\n").expect("lab");
    // Rules pick by architecture: only the aarch64 one may act on this machine.
    for arch in ["aarch64", "x86_64"] {
        lab.api_json(
            "POST",
            "/v1/rules",
            Some(
                &serde_json::json!({
                    "description": format!("{arch} machines"),
                    "conditions": [{"op": "eq", "field": "data://inventory.cpu.architecture",
                        "value": arch}],
                    "actions": [{"action": "set-attribute", "path": "extra/pool",
                        "value": format!("{arch} pool")}]
                })
                .to_string(),
            ),
        )
        .expect("the rule");
    }
    let spec = VmSpec {
        name: "arm64".into(),
        firmware: Firmware::Arm64Uefi,
        cpus: 1,
        memory_mb: 1024,
        disks_mb: vec![2048],
        macs: vec!["52:54:00:a6:00:01".into()],
        direct: None,
    };
    let vm = lab.boot(spec.clone()).expect("boot VM");
    let (node, took) = lab
        .wait_enrolled(vm, Duration::from_secs(1200))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!("arm64: power-on → enrolled {:.1} s", took.as_secs_f64());
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    let data = lab
        .data(node["uuid"].as_str().unwrap())
        .expect("processed data");
    assert_inventory_matches(&data, &spec, "uefi");
    assert_eq!(
        data["inventory"]["cpu"]["architecture"], "aarch64",
        "{data}"
    );
    assert_eq!(node["extra"]["pool"], "aarch64 pool", "{node}");
    assert!(
        timeline_says(&node, "dhcp", "boot grubaa64.efi"),
        "no DHCP answer with grubaa64.efi: {node}"
    );
    assert!(
        timeline_says(&node, "boot-script", "GRUB configuration served"),
        "no GRUB configuration in the timeline: {node}"
    );
}

/// A switch that speaks LLDP: lldpd on the lab's bridge (system `tor-sw-1`, port
/// `Ethernet1/7`, a frame a second) is heard by the agent (`paddock.lldp=1`), the raw TLVs
/// come back processed as Inspector's `lldp_basic` has them, and a rule reads them.
#[test]
fn the_switch_port_heard_over_lldp_is_processed() {
    let mut lab = Lab::start_with(
        "lldp",
        &artifacts(),
        "console=ttyS0 paddock.lldp=1 paddock.lldp_timeout=20",
        "",
    )
    .expect("lab");
    let sock = lab.dir.join("lldpd.sock");
    let mut switch = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.ns, "lldpd", "-d", "-I", "br0", "-u"])
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(lab.dir.join("lldpd.log")).unwrap())
        .spawn()
        .expect("lldpd (apt-get install lldpd)");
    let cli = |args: &str| {
        paddock_vm_tests::sh_ok(&format!(
            "ip netns exec {} lldpcli -u {} {args}",
            lab.ns,
            sock.display()
        ))
    };
    paddock_vm_tests::wait_for(
        "lldpd to answer",
        Duration::from_secs(30),
        || cli("show interfaces").ok(),
        String::new,
    );
    for c in [
        "configure system hostname tor-sw-1",
        "configure ports br0 lldp portdescription Ethernet1/7",
        "configure lldp tx-interval 1",
    ] {
        cli(c).unwrap_or_else(|e| panic!("{c}: {e:#}"));
    }
    lab.api_json(
        "POST",
        "/v1/rules",
        Some(
            &serde_json::json!({
                "description": "the switch port, as Kayobe reads it",
                "conditions": [{"op": "is-empty", "invert": true,
                    "field": "data://all_interfaces.eth0.lldp_processed.switch_port_description"}],
                "actions": [{"action": "set-attribute", "path": "extra/switch_port",
                    "value": "{data[all_interfaces][eth0][lldp_processed][switch_system_name]} {data[all_interfaces][eth0][lldp_processed][switch_port_description]}"}]
            })
            .to_string(),
        ),
    )
    .expect("the rule");
    let vm = lab
        .boot(VmSpec::bios("lldp", "52:54:00:11:d0:01"))
        .expect("boot VM");
    let (node, _) = lab
        .wait_enrolled(vm, Duration::from_secs(600))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let _ = switch.kill();
    let _ = switch.wait();
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    let data = lab.data(node["uuid"].as_str().unwrap()).expect("data");
    let lldp = &data["all_interfaces"]["eth0"]["lldp_processed"];
    assert_eq!(lldp["switch_port_description"], "Ethernet1/7", "{data}");
    assert_eq!(lldp["switch_system_name"], "tor-sw-1", "{data}");
    assert!(lldp["switch_chassis_id"].is_string(), "{lldp}");
    // The boot NIC's port names the switch and the port (Ironic's local_link_connection).
    let link = &node["ports"]["52:54:00:11:d0:01"]["local_link_connection"];
    assert_eq!(link["switch_info"], "tor-sw-1", "{node}");
    assert!(
        link["port_id"].is_string() && link["switch_id"].is_string(),
        "{link}"
    );
    // The console's machine page says where it is cabled.
    let (status, page) = lab
        .api(
            "GET",
            &format!("/ui/nodes/{}", node["uuid"].as_str().unwrap()),
            None,
        )
        .expect("console");
    assert_eq!(status, 200);
    assert!(
        page.contains("switch tor-sw-1 port Ethernet1/7"),
        "the console does not say the switch port:\n{page}"
    );
    assert_eq!(
        node["extra"]["switch_port"], "tor-sw-1 Ethernet1/7",
        "{node}"
    );
}

#[test]
fn four_vms_started_together_all_enrol() {
    let mut lab = Lab::start("four", &artifacts(), "").expect("lab");
    for i in 0..4 {
        let mut spec = VmSpec::bios(&format!("vm{i}"), &format!("52:54:00:f4:00:0{i}"));
        spec.disks_mb = vec![512 + 256 * i];
        lab.boot(spec).expect("boot");
    }
    let mut uuids = Vec::new();
    for i in 0..4 {
        let (node, took) = lab
            .wait_enrolled(i as usize, Duration::from_secs(400))
            .unwrap_or_else(|e| panic!("{e:#}"));
        println!("vm{i}: power-on → enrolled {:.1} s", took.as_secs_f64());
        assert_eq!(node["introspection"]["state"], "finished");
        let data = lab.data(node["uuid"].as_str().unwrap()).unwrap();
        assert_eq!(
            data["inventory"]["disks"][0]["size"].as_u64(),
            Some((512 + 256 * i) * MIB)
        );
        uuids.push(node["uuid"].as_str().unwrap().to_string());
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "four distinct nodes");
    let nodes = lab.api_json("GET", "/api/v1/nodes", None).unwrap();
    assert_eq!(
        nodes.as_array().unwrap().len(),
        4,
        "each machine enrolled once"
    );
}

#[test]
fn a_ramdisk_error_ends_in_error_with_its_message() {
    let mut lab = Lab::start_with(
        "fails",
        &artifacts(),
        "console=ttyS0 paddock.collectors=default,bogus",
        "",
    )
    .expect("lab");
    let vm = lab
        .boot(VmSpec::bios("fails", "52:54:00:ee:00:01"))
        .expect("boot");
    let (node, _) = lab
        .wait_enrolled(vm, Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(node["introspection"]["state"], "error", "{node}");
    let err = node["introspection"]["error"].as_str().unwrap();
    assert!(
        err.starts_with("Ramdisk reported error:") && err.contains("bogus"),
        "{err}"
    );
}

#[test]
fn an_aborted_introspection_refuses_the_inventory() {
    let mut lab = Lab::start("abort", &artifacts(), "").expect("lab");
    let mac = "52:54:00:ab:00:01";
    let node = lab
        .api_json(
            "POST",
            "/api/v1/nodes",
            Some(&format!(r#"{{"name":"victim","macs":["{mac}"]}}"#)),
        )
        .unwrap();
    let uuid = node["uuid"].as_str().unwrap().to_string();
    let (status, body) = lab.api("POST", "/v1/introspection/victim", None).unwrap();
    assert_eq!(status, 202, "{body}");
    let vm = lab.boot(VmSpec::bios("abort", mac)).expect("boot");
    // Once the machine has fetched its script (it is loading the ramdisk), abort.
    lab.wait_for_event(vm, &uuid, "boot-script", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (status, body) = lab
        .api("POST", "/v1/introspection/victim/abort", None)
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let n = lab
        .wait_for_event(vm, &uuid, "inventory-refused", Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(n["introspection"]["state"], "error");
    assert_eq!(n["introspection"]["error"], "Canceled by operator");
    let data = lab
        .api("GET", &format!("/v1/introspection/{uuid}/data"), None)
        .unwrap();
    assert_eq!(data.0, 404, "nothing was stored for the aborted run");
}

/// The PXE filter: an enrolled machine that boots again gets no answer from Paddock (it
/// would boot from its disk or the site's DHCP); once an introspection is started it boots
/// into the ramdisk again.
#[test]
fn the_pxe_filter_ignores_enrolled_machines_until_introspection() {
    let mut lab = Lab::start("filter", &artifacts(), "[firewall]\nenabled = true\n").expect("lab");
    let mac = "52:54:00:f1:00:01";
    let first = lab.boot(VmSpec::bios("first", mac)).expect("boot");
    let (node, took) = lab
        .wait_enrolled(first, Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!("filter: power-on → enrolled {:.1} s", took.as_secs_f64());
    let uuid = node["uuid"].as_str().unwrap().to_string();
    lab.wait_powered_off(first, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let dhcp_answers = |lab: &Lab| {
        let n = lab
            .api_json("GET", &format!("/api/v1/nodes/{uuid}"), None)
            .unwrap();
        n["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "dhcp")
            .count()
    };
    let before = dhcp_answers(&lab);
    assert!(before > 0);
    // Boots again: denied by the kernel filter, so no DHCP answer at all.
    let second = lab.boot(VmSpec::bios("second", mac)).expect("boot");
    std::thread::sleep(Duration::from_secs(40));
    assert_eq!(
        dhcp_answers(&lab),
        before,
        "an enrolled machine was answered"
    );
    let st = lab.api_json("GET", "/api/v1/firewall", None).unwrap();
    assert!(
        st["deny"].as_array().unwrap().iter().any(|m| m == mac),
        "{st}"
    );
    lab.vms[second].power_off();
    // Introspection started: the next boot is answered and runs the ramdisk again.
    let (status, body) = lab
        .api("POST", &format!("/v1/introspection/{uuid}"), None)
        .unwrap();
    assert_eq!(status, 202, "{body}");
    let third = lab.boot(VmSpec::bios("third", mac)).expect("boot");
    let (node, _) = lab
        .wait_enrolled(third, Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(node["uuid"], uuid.as_str(), "the same node");
    assert_eq!(node["introspection"]["state"], "finished");
    let inventories = node["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "inventory-received")
        .count();
    assert_eq!(inventories, 2, "inspected twice");
}

/// A UEFI machine on an IPv6-only network (no DHCPv4 anywhere, IPv4 PXE off in its
/// firmware): router advertisements send it to DHCPv6, which gives it an address and
/// `tftp://[2001:2::1]/…`; iPXE asks DHCPv6 again and gets its script over HTTP on IPv6; the
/// agent leases its own address by DHCPv6 and reports over HTTPS on IPv6.
#[test]
fn ipv6_only_uefi_vm_is_inspected_and_enrolled() {
    let mut lab = Lab::start_ipv6_only("v6only", &artifacts(), "").expect("lab");
    let spec = VmSpec {
        name: "v6only".into(),
        firmware: Firmware::UefiIpv6,
        cpus: 1,
        memory_mb: 1024,
        disks_mb: vec![2048],
        macs: vec!["52:54:00:a6:06:01".into()],
        direct: None,
    };
    let vm = lab.boot(spec.clone()).expect("boot VM");
    let (node, took) = lab
        .wait_enrolled(vm, Duration::from_secs(900))
        .unwrap_or_else(|e| panic!("{e:#}"));
    println!(
        "ipv6-only UEFI: power-on → enrolled {:.1} s",
        took.as_secs_f64()
    );
    assert_eq!(node["introspection"]["state"], "finished", "{node}");
    let data = lab
        .data(node["uuid"].as_str().unwrap())
        .expect("processed data");
    let inv = &data["inventory"];
    let boot = inv["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["mac_address"] == spec.macs[0].as_str())
        .unwrap_or_else(|| panic!("no boot NIC in {inv}"));
    // The address DHCPv6 leased it, from the pool, and no IPv4 address at all.
    let v6: std::net::Ipv6Addr = boot["ipv6_address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no IPv6 address: {boot}"));
    assert!(
        v6.segments()[..4] == [0x2001, 2, 0, 0] && (0x100..=0x1ff).contains(&v6.segments()[7]),
        "{v6} is not from the DHCPv6 pool"
    );
    assert!(boot["ipv4_address"].is_null(), "{boot}");
    // The DHCPv6 answers to the firmware and to iPXE are on its timeline.
    assert!(
        timeline_says(&node, "dhcp", "DHCPv6 Reply") && timeline_says(&node, "dhcp", ".ipxe"),
        "no DHCPv6 answers in the timeline: {node}"
    );
    assert_eq!(inv["boot"]["current_boot_mode"], "uefi");
    // The lease the appliance holds is that address, for that MAC.
    let leases = lab
        .api_json("GET", "/api/v1/leases6", None)
        .expect("leases6");
    let text = leases.to_string();
    assert!(
        text.contains(&v6.to_string()) && text.contains(spec.macs[0].as_str()),
        "{v6} for {} not in {leases}",
        spec.macs[0]
    );
}
