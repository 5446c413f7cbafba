//! Processing hooks, as Inspector runs them: `ramdisk_error` and `validate_interfaces` before
//! lookup; `root_disk_selection`, `scheduler` and `capabilities` after. Pure functions from the
//! posted data (and the node's hints) to processed data and node properties.

use std::collections::BTreeMap;

use paddock_inventory::MacAddr;
use paddock_inventory::{Disk, IntrospectionData, Inventory, lenient, normalise_mac};
use serde_json::{Map, Value, json};

use crate::lookup::real_bmc;
use crate::py::{str_of, truthy};

const GIB: u64 = 1 << 30;

/// What `validate_interfaces` found.
#[derive(Clone, Debug, PartialEq)]
pub struct Interfaces {
    /// name → {ip, mac, client_id, pxe}
    pub all: Map<String, Value>,
    /// The subset that becomes the node's ports (`add_ports = pxe`).
    pub used: Map<String, Value>,
    pub macs: Vec<MacAddr>,
    pub all_macs: Vec<MacAddr>,
    pub pxe_mac: Option<MacAddr>,
    pub bmc: Option<String>,
    /// `local_link_connection`: each NIC's switch port heard over LLDP, by MAC.
    pub links: BTreeMap<String, Map<String, Value>>,
}

/// Why a processing hook fails the introspection (Inspector's messages, word for word).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// `ramdisk_error`: what the ramdisk said went wrong.
    #[error("Ramdisk reported error: {0}")]
    Ramdisk(String),
    /// `validate_interfaces`: no interface to add ports for (the inventory's names).
    #[error("No suitable interfaces found in {0:?}")]
    NoInterfaces(Vec<String>),
    /// `root_disk_selection`: hints given, but the inventory has no disk.
    #[error("No disks found to apply root device hints to")]
    NoDisks,
    /// `root_disk_selection`: no disk satisfies the hints (given as JSON).
    #[error("No disks satisfied root device hints {0}")]
    NoDiskMatches(Value),
}

/// `ramdisk_error`: a ramdisk that reported an error fails processing with its message.
pub fn ramdisk_error(data: &IntrospectionData) -> Result<(), HookError> {
    match data.error.as_deref().map(str::trim) {
        Some(e) if !e.is_empty() => Err(HookError::Ramdisk(e.to_string())),
        _ => Ok(()),
    }
}

/// `validate_interfaces` (pre-processing part).
pub fn validate_interfaces(
    data: &IntrospectionData,
    inv: &Inventory,
) -> Result<Interfaces, HookError> {
    let pxe = data
        .boot_interface
        .as_deref()
        .or(inv.boot.as_ref().and_then(|b| b.pxe_interface.as_deref()))
        .and_then(normalise_mac);
    let mut all = Map::new();
    let mut used = Map::new();
    let mut all_macs = Vec::new();
    let mut links = BTreeMap::new();
    for iface in &inv.interfaces {
        if iface.name == "lo" {
            continue;
        }
        let Some(mac) = iface.mac_address.as_deref().and_then(normalise_mac) else {
            continue;
        };
        let Ok(parsed) = mac.parse::<MacAddr>() else {
            continue;
        };
        let is_pxe = pxe.as_deref() == Some(mac.as_str());
        let mut entry = json!({
            "ip": iface.ipv4_address,
            "mac": mac,
            "client_id": iface.client_id,
            "pxe": is_pxe,
        });
        // `lldp_basic`, on by default here: what the switch port said, where Inspector's
        // client and rules read it.
        if let Some(tlvs) = iface.lldp.as_deref().filter(|t| !t.is_empty()) {
            entry["lldp_processed"] = Value::Object(paddock_inventory::lldp::processed(tlvs));
            // `local_link_connection`: the port's switch and port, for the node's ports.
            if let Some(link) = paddock_inventory::lldp::local_link_connection(tlvs) {
                links.insert(mac.clone(), link);
            }
        }
        all.insert(iface.name.clone(), entry.clone());
        all_macs.push(parsed);
        // add_ports = pxe: the PXE NIC when it is known, otherwise NICs with an address.
        let keep = match &pxe {
            Some(_) => is_pxe,
            None => iface
                .ipv4_address
                .as_deref()
                .is_some_and(|ip| !ip.is_empty()),
        };
        if keep {
            used.insert(iface.name.clone(), entry);
        }
    }
    if used.is_empty() {
        return Err(HookError::NoInterfaces(
            inv.interfaces.iter().map(|i| i.name.clone()).collect(),
        ));
    }
    let macs = used
        .values()
        .filter_map(|v| v["mac"].as_str()?.parse().ok())
        .collect();
    Ok(Interfaces {
        all,
        used,
        macs,
        all_macs,
        pxe_mac: pxe.and_then(|m| m.parse().ok()),
        bmc: real_bmc(inv.bmc_address.as_deref()).map(String::from),
        links,
    })
}

/// `root_disk_selection`: the disk matching the node's `root_device` hints, or (no hints) the
/// ramdisk's choice, or the smallest disk of at least 4 GiB.
pub fn root_disk_selection(
    data: &IntrospectionData,
    inv: &Inventory,
    hints: Option<&Value>,
) -> Result<Option<Disk>, HookError> {
    let Some(hints) = hints.and_then(Value::as_object).filter(|h| !h.is_empty()) else {
        if let Some(d) = &data.root_disk {
            return Ok(Some(d.clone()));
        }
        return Ok(paddock_inventory::hints::default_root_disk(&inv.disks).cloned());
    };
    if inv.disks.is_empty() {
        return Err(HookError::NoDisks);
    }
    paddock_inventory::hints::disk_matching(&inv.disks, hints)
        .cloned()
        .map(Some)
        .ok_or_else(|| HookError::NoDiskMatches(Value::Object(hints.clone())))
}

/// The CPU flags Inspector's `capabilities` hook maps to capabilities
/// (`[capabilities] cpu_flags` default), in its order.
const CPU_FLAGS: [(&str, &str); 6] = [
    ("vmx", "cpu_vt"),
    ("svm", "cpu_vt"),
    ("aes", "cpu_aes"),
    ("pse", "cpu_hugepages"),
    ("pdpe1gb", "cpu_hugepages_1g"),
    ("smx", "cpu_txt"),
];

/// `capabilities`: the capabilities the inventory gives, in Inspector's order (boot mode,
/// then the CPU flags), to merge into the node's (`update_capabilities`).
pub fn capabilities(inv: &Inventory) -> Vec<(String, Option<String>)> {
    let mut caps: Vec<(String, Option<String>)> = Vec::new();
    if let Some(b) = inv
        .boot
        .as_ref()
        .filter(|b| !b.current_boot_mode.is_empty())
    {
        caps.push(("boot_mode".into(), Some(b.current_boot_mode.clone())));
    }
    if let Some(c) = &inv.cpu {
        for (flag, cap) in CPU_FLAGS {
            if c.flags.iter().any(|f| f == flag) && !caps.iter().any(|(k, _)| k == cap) {
                caps.push((cap.into(), Some("true".into())));
            }
        }
    }
    caps
}

/// `scheduler` and `root_disk_selection`: the node properties of the processed data —
/// `cpus`, `cpu_arch` and `memory_mb` when set and true (`introspection_data.get(key)`),
/// `local_gb` always.
pub fn properties(processed: &Value) -> Map<String, Value> {
    let mut p = Map::new();
    for k in ["cpus", "cpu_arch", "memory_mb", "local_gb"] {
        if let Some(v) = processed.get(k).filter(|v| k == "local_gb" || truthy(v)) {
            p.insert(k.into(), v.clone());
        }
    }
    p
}

/// An int as JSON holds one (beyond 64 bits it is unreadable here).
fn int_value(i: i128) -> Option<Value> {
    i64::try_from(i)
        .map(Value::from)
        .or_else(|_| u64::try_from(i).map(Value::from))
        .ok()
}

/// A disk of the posted inventory, as posted, by name.
fn raw_disk<'a>(raw: &'a Value, name: &str) -> Option<&'a Value> {
    raw.pointer("/inventory/disks")?
        .as_array()?
        .iter()
        .find(|d| d.get("name").and_then(Value::as_str) == Some(name))
}

/// The processed data Inspector stores and runs rules on: the posted body as posted, plus
/// what the hooks add, in their order — `ipmi_address`, `ipmi_v6address`, `all_interfaces`
/// and `interfaces` (dicts keyed by interface name), `macs` (`validate_interfaces`),
/// `auto_discovered` (the `enroll` not-found hook), `root_disk` (the disk the node's hints
/// chose, as posted), `local_gb`, `cpus`, `cpu_arch`, `memory_mb` (`scheduler`, which reads
/// them with `int()` and `str()`). `root` is the disk chosen; `hinted` says whether the
/// node's root device hints chose it.
pub fn processed(
    raw: &Value,
    ifaces: &Interfaces,
    root: Option<&Disk>,
    hinted: bool,
    auto_discovered: bool,
) -> Value {
    let mut v = raw.clone();
    let Value::Object(m) = &mut v else {
        return v;
    };
    let inventory = raw.get("inventory").cloned().unwrap_or(Value::Null);
    if let Some(Value::Object(inv)) = m.get_mut("inventory")
        && !inv.get("disks").is_some_and(truthy)
    {
        // `utils.get_inventory`: a disk-less node gets an empty list.
        inv.insert("disks".into(), json!([]));
    }
    let bmc = |key: &str, none: &str| {
        inventory
            .get(key)
            .filter(|a| a.as_str().is_none_or(|a| !a.is_empty() && a != none))
            .cloned()
            .unwrap_or(Value::Null)
    };
    m.insert("ipmi_address".into(), bmc("bmc_address", "0.0.0.0"));
    m.insert("ipmi_v6address".into(), bmc("bmc_v6address", "::/0"));
    m.insert("all_interfaces".into(), Value::Object(ifaces.all.clone()));
    m.insert("interfaces".into(), Value::Object(ifaces.used.clone()));
    let macs: Vec<String> = ifaces.macs.iter().map(MacAddr::to_string).collect();
    m.insert("macs".into(), json!(macs));
    if auto_discovered {
        m.insert("auto_discovered".into(), json!(true));
    }
    let posted_root = raw.get("root_disk").filter(|r| truthy(r));
    if let Some(d) = root
        && (hinted || posted_root.is_none())
    {
        let disk = raw_disk(raw, &d.name).cloned().unwrap_or_else(|| json!(d));
        m.insert("root_disk".into(), disk);
    }
    let size = m
        .get("root_disk")
        .filter(|r| truthy(r))
        .and_then(|r| r.get("size"))
        .and_then(lenient::python_int)
        .unwrap_or(0);
    let gib = size.div_euclid(i128::from(GIB));
    // disk_partitioning_spacing: 1 GiB less, unless the disk is smaller than 1 GiB.
    m.insert(
        "local_gb".into(),
        int_value(if gib > 0 { gib - 1 } else { 0 }).unwrap_or(json!(0)),
    );
    let cpu = inventory.get("cpu");
    if let Some(count) = cpu
        .and_then(|c| c.get("count"))
        .and_then(lenient::python_int)
        .and_then(int_value)
    {
        m.insert("cpus".into(), count);
        if let Some(arch) = cpu.and_then(|c| c.get("architecture")) {
            m.insert("cpu_arch".into(), json!(str_of(arch)));
        }
    }
    if let Some(mb) = inventory
        .pointer("/memory/physical_mb")
        .and_then(lenient::python_int)
        .and_then(int_value)
    {
        m.insert("memory_mb".into(), mb);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_inventory::{Boot, Cpu, Interface, Memory};

    fn disk(name: &str, gib: u64, serial: &str) -> Disk {
        Disk {
            name: name.into(),
            size: gib * GIB,
            serial: Some(serial.into()),
            rotational: true,
            ..Disk::default()
        }
    }

    fn interface(name: &str, mac: Option<&str>) -> Interface {
        Interface {
            name: name.into(),
            mac_address: mac.map(Into::into),
            ..Interface::default()
        }
    }

    fn inventory() -> Inventory {
        Inventory {
            interfaces: vec![
                interface("lo", Some("00:00:00:00:00:00")),
                Interface {
                    ipv4_address: Some("198.18.0.100".into()),
                    ..interface("eth0", Some("52:54:00:00:00:01"))
                },
                interface("eth1", Some("52:54:00:00:00:02")),
                interface("ib0", None),
            ],
            cpu: Some(Cpu {
                count: Some(4),
                architecture: Some("x86_64".into()),
                flags: vec!["vmx".into(), "aes".into(), "sse".into()],
                ..Cpu::default()
            }),
            memory: Some(Memory {
                total: Some(500 << 20),
                physical_mb: Some(512),
                ..Memory::default()
            }),
            disks: vec![
                disk("/dev/vda", 20, "AAA"),
                disk("/dev/vdb", 8, "BBB"),
                disk("/dev/vdc", 2, "CCC"),
            ],
            boot: Some(Boot {
                current_boot_mode: "bios".into(),
                pxe_interface: None,
            }),
            bmc_address: Some("0.0.0.0".into()),
            ..Inventory::default()
        }
    }

    #[test]
    fn interfaces_pxe_first_then_addressed() {
        let inv = inventory();
        let mut data = IntrospectionData {
            boot_interface: Some("01-52-54-00-00-00-02".into()),
            ..Default::default()
        };
        let i = validate_interfaces(&data, &inv).unwrap();
        assert_eq!(i.all.len(), 2, "lo and MAC-less skipped");
        assert_eq!(i.used.keys().collect::<Vec<_>>(), ["eth1"]);
        assert_eq!(i.pxe_mac, Some(MacAddr([0x52, 0x54, 0, 0, 0, 2])));
        assert_eq!(i.bmc, None, "0.0.0.0 is no BMC");
        data.boot_interface = None;
        let i = validate_interfaces(&data, &inv).unwrap();
        assert_eq!(
            i.used.keys().collect::<Vec<_>>(),
            ["eth0"],
            "with no PXE NIC, those with an address"
        );
        let mut bare = inventory();
        bare.interfaces.truncate(1);
        assert!(
            validate_interfaces(&data, &bare)
                .unwrap_err()
                .to_string()
                .starts_with("No suitable interfaces found")
        );
    }

    #[test]
    fn root_disk_hints() {
        let inv = inventory();
        let data = IntrospectionData::default();
        let pick = |h: Value| root_disk_selection(&data, &inv, Some(&h)).map(|d| d.map(|d| d.name));
        assert_eq!(
            root_disk_selection(&data, &inv, None)
                .unwrap()
                .unwrap()
                .name,
            "/dev/vdb",
            "smallest ≥ 4 GiB"
        );
        assert_eq!(pick(json!({"serial": "AAA"})).unwrap().unwrap(), "/dev/vda");
        assert_eq!(pick(json!({"size": 8})).unwrap().unwrap(), "/dev/vdb");
        assert_eq!(pick(json!({"size": ">= 10"})).unwrap().unwrap(), "/dev/vda");
        assert_eq!(
            pick(json!({"name": "s== /dev/vdc", "rotational": true}))
                .unwrap()
                .unwrap(),
            "/dev/vdc"
        );
        assert!(
            pick(json!({"serial": "ZZZ"}))
                .unwrap_err()
                .to_string()
                .contains("No disks satisfied root device hints")
        );
        assert!(
            pick(json!({"colour": "red"})).is_err(),
            "unknown hint matches nothing"
        );
    }

    #[test]
    fn scheduler_and_capabilities() {
        let inv = inventory();
        assert_eq!(
            capabilities(&inv),
            [
                ("boot_mode".to_string(), Some("bios".to_string())),
                ("cpu_vt".to_string(), Some("true".to_string())),
                ("cpu_aes".to_string(), Some("true".to_string())),
            ]
        );
    }

    /// The processed data is the body as posted plus what the hooks add, in Inspector's
    /// order (`plugins/standard.py`; `utils.get_inventory`; `plugins/discovery.py`).
    #[test]
    fn processed_data_is_the_body_plus_the_hooks() {
        let raw = json!({
            "inventory": {
                "interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01", "ipv4_address": "198.18.0.100"}],
                "cpu": {"count": "4", "architecture": "x86_64"},
                "memory": {"physical_mb": 2048},
                "disks": [{"name": "/dev/sda", "size": 20 * GIB, "vendor": "x"}],
                "bmc_address": "0.0.0.0"
            },
            "root_disk": {"name": "/dev/sda", "size": 20 * GIB},
            "boot_interface": "52:54:00:00:00:01"
        });
        let data = IntrospectionData::parse(raw.to_string().as_bytes()).unwrap();
        let inv = data.inventory_checked().unwrap();
        let ifaces = validate_interfaces(&data, inv).unwrap();
        let root = root_disk_selection(&data, inv, None).unwrap();
        let p = processed(&raw, &ifaces, root.as_ref(), false, true);
        let keys: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "inventory",
                "root_disk",
                "boot_interface",
                "ipmi_address",
                "ipmi_v6address",
                "all_interfaces",
                "interfaces",
                "macs",
                "auto_discovered",
                "local_gb",
                "cpus",
                "cpu_arch",
                "memory_mb"
            ]
        );
        assert_eq!(p["root_disk"], raw["root_disk"], "kept as posted");
        assert_eq!(p["ipmi_address"], Value::Null, "0.0.0.0 is no BMC");
        assert_eq!(p["interfaces"]["eth0"]["ip"], "198.18.0.100");
        assert_eq!(
            (p["cpus"].clone(), p["local_gb"].clone()),
            (json!(4), json!(19))
        );
        assert_eq!(
            p["inventory"]["interfaces"][0].get("has_carrier"),
            None,
            "nothing added"
        );
        let props = properties(&p);
        assert_eq!(
            Value::Object(props),
            json!({"cpus": 4, "cpu_arch": "x86_64", "memory_mb": 2048, "local_gb": 19})
        );
        // Hints choose the disk, as posted in the inventory.
        // Numbers beyond JSON's 64 bits are not read (and do not break processing).
        let mut huge = raw.clone();
        huge["inventory"]["cpu"]["count"] = json!("99999999999999999999999");
        huge["root_disk"]["size"] = json!("999999999999999999999999999999");
        let p = processed(&huge, &ifaces, root.as_ref(), false, false);
        assert_eq!((p.get("cpus"), &p["local_gb"]), (None, &json!(0)));
        let hinted = processed(&raw, &ifaces, Some(&inv.disks[0]), true, false);
        assert_eq!(hinted["root_disk"]["vendor"], "x");
        assert_eq!(hinted.get("auto_discovered"), None);
    }

    #[test]
    fn ramdisk_errors_fail_processing() {
        let mut d = IntrospectionData::default();
        assert!(ramdisk_error(&d).is_ok());
        d.error = Some("  ".into());
        assert!(ramdisk_error(&d).is_ok());
        d.error = Some("disk collector: no /sys/block".into());
        assert_eq!(
            ramdisk_error(&d).unwrap_err().to_string(),
            "Ramdisk reported error: disk collector: no /sys/block"
        );
    }
}
