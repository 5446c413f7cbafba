//! Power control end to end: a libvirt TCG domain on the lab's bridge with
//! sushy-tools (Redfish) and virtualbmc (IPMI) in front of it; the appliance powers it on
//! with a one-time PXE boot for an introspection started with `manage_boot`, the domain
//! PXE-boots the ramdisk through iPXE, is inspected and powered off, with no harness action
//! on the VM; then the same over IPMI, and a clean from the CLI that reboots it through its
//! BMC. Needs root, libvirt, QEMU, iPXE, ipmitool and the ramdisk (`scripts/build-ramdisk.sh`);
//! the emulators' venv is built once by `scripts/bmc-harness.sh venv`.

use std::time::{Duration, Instant};

use paddock_vm_tests::bmc::{Bmcs, Domain, PASSWORD};
use paddock_vm_tests::{Artifacts, Lab, tail};
use serde_json::{Value, json};

const MAC: &str = "52:54:00:18:00:42";
/// A TCG boot into the ramdisk and an inspection take about 30 s; be generous.
const INSPECTED_WITHIN: Duration = Duration::from_secs(600);

fn timeline(lab: &Lab, node: &str) -> Vec<(String, String, bool)> {
    let n = lab
        .api_json("GET", &format!("/api/v1/nodes/{node}"), None)
        .expect("node");
    n["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["kind"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
                e["error"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn has_entry(lab: &Lab, node: &str, text: &str) -> bool {
    timeline(lab, node).iter().any(|(_, m, _)| m.contains(text))
}

fn wait_entry(lab: &Lab, bmcs: &Bmcs, node: &str, text: &str, timeout: Duration) {
    let t = Instant::now();
    while !has_entry(lab, node, text) {
        assert!(
            t.elapsed() < timeout,
            "no {text:?} on {node}'s timeline within {timeout:?}: {:#?}\n--- console ---\n{}\n--- paddock ---\n{}",
            timeline(lab, node),
            tail(&bmcs.console(), 3000),
            tail(&lab.appliance_log(), 3000)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Starts an introspection with `manage_boot` and waits until it finished and the domain is
/// off; returns the time from the request to the finished introspection.
fn introspect(lab: &Lab, bmcs: &mut Bmcs, node: &str) -> Duration {
    assert_eq!(bmcs.domstate().unwrap(), "shut off", "starts off");
    let t = Instant::now();
    let (st, body) = lab
        .api(
            "POST",
            &format!("/v1/introspection/{node}?manage_boot=true"),
            None,
        )
        .unwrap();
    assert_eq!(st, 202, "{body}");
    // Paddock powers it on through its BMC: nobody else touches the domain.
    bmcs.wait_state("running", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", tail(&lab.appliance_log(), 3000)));
    let on = t.elapsed();
    let took = loop {
        let s: Value = lab
            .api_json("GET", &format!("/v1/introspection/{node}"), None)
            .unwrap();
        if s["finished"] == true {
            assert!(s["error"].is_null(), "introspection failed: {s}");
            break t.elapsed();
        }
        assert!(
            t.elapsed() < INSPECTED_WITHIN,
            "not inspected within {INSPECTED_WITHIN:?}: {s}\n--- console ---\n{}\n--- paddock ---\n{}",
            tail(&bmcs.console(), 3000),
            tail(&lab.appliance_log(), 3000)
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    wait_entry(
        lab,
        bmcs,
        node,
        "power off through the BMC (introspection finished)",
        Duration::from_secs(120),
    );
    let off = bmcs
        .wait_state("shut off", Duration::from_secs(120))
        .unwrap();
    eprintln!(
        "{node}: powered on {:.1} s after the request, inspected at {:.1} s, off {:.1} s later",
        on.as_secs_f64(),
        took.as_secs_f64(),
        off.as_secs_f64()
    );
    assert!(has_entry(
        lab,
        node,
        "PXE boot once, then reboot through the BMC (introspection)"
    ));
    took
}

#[test]
fn a_node_with_a_bmc_is_introspected_with_manage_boot_and_cleaned_through_its_bmc() {
    assert_eq!(
        paddock_vm_tests::sh_ok("id -u").unwrap().trim(),
        "0",
        "VM scenarios need root"
    );
    let total = Instant::now();
    let artifacts =
        Artifacts::from_env().unwrap_or_else(|e| panic!("VM scenarios cannot run: {e:#}"));
    let lab = Lab::start(
        "power",
        &artifacts,
        "[power]\nmax_power_ons = 2\ninterval_secs = 10\nsync_secs = 5\n",
    )
    .expect("lab");
    let mut bmcs = Bmcs::start(
        &lab,
        Domain {
            name: "paddock-power-vm".into(),
            mac: MAC.into(),
            // The ramdisk's clean needs a disk of at least 4 GiB (qcow2: sparse).
            memory_mb: 1024,
            disk_mb: 4096,
        },
    )
    .expect("BMC emulators");

    // (a) Redfish. The node is known only by its BMC: no MAC (the appliance reads them
    // from the BMC when the introspection starts).
    let body = json!({"name": "bmc-vm", "bmc_address": "198.18.0.1", "driver": "redfish",
        "driver_info": bmcs.redfish_driver_info()});
    let (st, created) = lab
        .api("POST", "/api/v1/nodes", Some(&body.to_string()))
        .unwrap();
    assert_eq!(st, 201, "{created}");
    let power = lab
        .api_json("GET", "/api/v1/nodes/bmc-vm/power", None)
        .unwrap();
    assert_eq!(power["state"], "off", "{power}");
    assert_eq!(power["bmc"]["driver"], "redfish", "{power}");
    for path in [
        "/api/v1/nodes/bmc-vm",
        "/api/v1/nodes/bmc-vm/power",
        "/api/v1/nodes",
    ] {
        let (_, text) = lab.api("GET", path, None).unwrap();
        assert!(
            !text.contains(PASSWORD),
            "{path} shows the password: {text}"
        );
    }
    introspect(&lab, &mut bmcs, "bmc-vm");
    assert!(has_entry(
        &lab,
        "bmc-vm",
        &format!("MACs read from the BMC: {MAC}")
    ));

    // (b) IPMI: the same node, driven through virtualbmc.
    let patch = json!([
        {"op": "replace", "path": "/driver", "value": "ipmi"},
        {"op": "remove", "path": "/driver_info/redfish_address"},
        {"op": "add", "path": "/driver_info/ipmi_address", "value": bmcs.ipmi_driver_info()["ipmi_address"]},
        {"op": "add", "path": "/driver_info/ipmi_port", "value": bmcs.ipmi_driver_info()["ipmi_port"]},
        {"op": "add", "path": "/driver_info/ipmi_username", "value": bmcs.ipmi_driver_info()["ipmi_username"]},
        {"op": "add", "path": "/driver_info/ipmi_password", "value": PASSWORD},
    ]);
    let (st, patched) = lab
        .api("PATCH", "/api/v1/nodes/bmc-vm", Some(&patch.to_string()))
        .unwrap();
    assert_eq!(st, 200, "{patched}");
    assert!(!patched.contains(PASSWORD), "{patched}");
    let status = lab.cli("node power bmc-vm status").unwrap();
    assert!(
        status.contains("power off (ipmi 198.18.0.1:6230)"),
        "{status}"
    );
    introspect(&lab, &mut bmcs, "bmc-vm");

    // (c) A clean from the CLI: the node reboots into the ramdisk through its BMC, wipes
    // its disk and powers off.
    let t = Instant::now();
    let out = lab.cli("node clean bmc-vm").unwrap();
    eprintln!("{}", out.trim());
    bmcs.wait_state("running", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", tail(&lab.appliance_log(), 3000)));
    assert!(has_entry(
        &lab,
        "bmc-vm",
        "PXE boot once, then reboot through the BMC (provisioning: clean)"
    ));
    let cleaned = loop {
        let p = lab
            .api_json("GET", "/api/v1/nodes/bmc-vm/provisioning", None)
            .unwrap();
        let state = p["state"].as_str().unwrap_or("");
        if state != "clean" {
            assert_ne!(state, "error", "the clean failed: {p}");
            break t.elapsed();
        }
        assert!(
            t.elapsed() < INSPECTED_WITHIN,
            "not cleaned within {INSPECTED_WITHIN:?}: {p}\n{}",
            tail(&bmcs.console(), 3000)
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    bmcs.wait_state("shut off", Duration::from_secs(120))
        .unwrap();
    eprintln!(
        "clean from the CLI: rebooted through the BMC and cleaned in {:.1} s",
        cleaned.as_secs_f64()
    );
    let metrics = lab.api("GET", "/metrics", None).unwrap().1;
    assert!(metrics.contains("paddock_power_queue 0"), "{metrics}");
    drop(bmcs);
    drop(lab);
    eprintln!(
        "whole power scenario in {:.1} s",
        total.elapsed().as_secs_f64()
    );
}
