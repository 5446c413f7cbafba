//! The introspection data the Ironic Python Agent posts to `/v1/continue`, as typed Rust.
//!
//! Field names and shapes follow IPA (`hardware.py` serialisation), so an unmodified IPA
//! ramdisk and Paddock's own agent produce the same JSON. Fields IPA may send as `null` are
//! `Option`s; fields we do not model are kept in `extra` so nothing an agent sends is lost.
//! Scalars are read as Inspector's hooks read them ([`lenient`]): `"count": "4"` is 4, a value
//! that cannot be read is absent; only the structure can make a body unusable.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod hints;
pub mod lenient;
pub mod lldp;
pub mod mac;

pub use mac::{MacAddr, MacParseError};

/// The whole body of `POST /v1/continue`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IntrospectionData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<Inventory>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub root_disk: Option<Disk>,
    /// The MAC the machine PXE-booted from, plain or pxelinux style (`01-aa-bb-…`).
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_interface: Option<String>,
    /// Set when the ramdisk failed; processing then ends in `error` with this message.
    #[serde(
        default,
        deserialize_with = "lenient::error_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<String>,
    /// Base64 tar.gz of ramdisk logs (IPA), kept as sent.
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub logs: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu: Option<Cpu>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub bmc_address: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub bmc_v6address: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub system_vendor: Option<SystemVendor>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub boot: Option<Boot>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub hostname: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    #[serde(default, deserialize_with = "lenient::string_or_empty")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub mac_address: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub ipv4_address: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub ipv6_address: Option<String>,
    #[serde(default, deserialize_with = "lenient::boolish")]
    pub has_carrier: bool,
    /// LLDP TLVs as IPA sends them: `[[type, "hex value"], …]`.
    #[serde(default, deserialize_with = "lenient::or_none")]
    pub lldp: Option<Vec<(u8, String)>>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub vendor: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub product: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub client_id: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub biosdevname: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub speed_mbps: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub pci_address: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub driver: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub model_name: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub frequency: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    pub count: Option<u32>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub architecture: Option<String>,
    #[serde(default, deserialize_with = "lenient::strings")]
    pub flags: Vec<String>,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    pub socket_count: Option<u32>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Bytes usable by the OS.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub total: Option<u64>,
    /// Installed physical memory in MiB (from DMI where available).
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub physical_mb: Option<u64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    #[serde(default, deserialize_with = "lenient::string_or_empty")]
    pub name: String,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub model: Option<String>,
    /// Bytes.
    #[serde(default, deserialize_with = "lenient::u64_or_zero")]
    pub size: u64,
    #[serde(default, deserialize_with = "lenient::boolish")]
    pub rotational: bool,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub wwn: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub serial: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub vendor: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub wwn_with_extension: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub wwn_vendor_extension: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub hctl: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub by_path: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub logical_sectors: Option<u64>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub physical_sectors: Option<u64>,
    #[serde(
        default,
        deserialize_with = "lenient::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub tran: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemVendor {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub product_name: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub serial_number: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub manufacturer: Option<String>,
    #[serde(
        default,
        deserialize_with = "lenient::or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub firmware: Option<Firmware>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Firmware {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub vendor: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub version: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub build_date: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Boot {
    /// `bios` or `uefi`.
    #[serde(default, deserialize_with = "lenient::string_or_empty")]
    pub current_boot_mode: String,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    pub pxe_interface: Option<String>,
}

/// Why a body is not usable introspection data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("introspection data is not valid JSON of the IPA shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("introspection data must be a JSON object")]
    NotObject,
    #[error("Hardware inventory is empty or missing")]
    NoInventory,
    #[error("No network interfaces provided")]
    NoInterfaces,
}

impl IntrospectionData {
    /// Parses a `/v1/continue` body: JSON object of the IPA shape (types checked); the
    /// inventory's presence is checked by [`IntrospectionData::inventory_checked`], because a
    /// ramdisk error report may come without one.
    pub fn parse(body: &[u8]) -> Result<Self, DataError> {
        Ok(Self::read(body)?.0)
    }

    /// The data and the JSON as posted, from one parse of the body: rules and the
    /// processed data read the JSON, the hooks the typed data.
    pub fn read(body: &[u8]) -> Result<(Self, Value), DataError> {
        let value: Value = serde_json::from_slice(body)?;
        if !value.is_object() {
            return Err(DataError::NotObject);
        }
        Ok((serde_json::from_value(value.clone())?, value))
    }

    /// The inventory, which must exist and list at least one interface.
    pub fn inventory_checked(&self) -> Result<&Inventory, DataError> {
        let inv = self.inventory.as_ref().ok_or(DataError::NoInventory)?;
        if inv.interfaces.is_empty() {
            return Err(DataError::NoInterfaces);
        }
        Ok(inv)
    }
}

/// Normalises a MAC as IPA and Inspector do: lower case, and the pxelinux `01-aa-bb-…` form
/// turned into `aa:bb:…`. Returns `None` for anything that is not a MAC.
pub fn normalise_mac(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let s = match s.strip_prefix("01-") {
        Some(rest) if rest.len() == 17 => rest.replace('-', ":"),
        _ => s.replace('-', ":"),
    };
    let ok = s.len() == 17
        && s.split(':').count() == 6
        && s.split(':')
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Inspector api-ref sample request, trimmed.
    const SAMPLE: &str = r#"{"inventory": {
       "interfaces": [{"name": "eth0", "mac_address": "52:54:00:4e:3d:30", "ipv4_address": "172.24.42.100",
                       "ipv6_address": null, "has_carrier": true, "lldp": null, "vendor": "0x1af4",
                       "product": "0x0001", "client_id": null, "biosdevname": null, "speed_mbps": 1000}],
       "cpu": {"model_name": "Intel Xeon", "frequency": "2100.084", "count": 2, "architecture": "x86_64",
               "flags": ["fpu", "vmx", "aes"], "socket_count": 1},
       "memory": {"total": 2105864192, "physical_mb": 2048},
       "disks": [{"name": "/dev/vda", "model": "", "size": 13958643712, "rotational": true, "wwn": null,
                  "serial": null, "vendor": "0x1af4", "wwn_with_extension": null, "wwn_vendor_extension": null,
                  "hctl": null, "by_path": "/dev/disk/by-path/pci-0000:00:04.0"}],
       "bmc_address": "192.168.2.134", "bmc_v6address": "::/0",
       "system_vendor": {"product_name": "Bochs", "serial_number": "Not Specified", "manufacturer": "Bochs",
                         "firmware": {"vendor": "SeaBIOS", "version": "1.16", "build_date": "04/01/2014"}},
       "boot": {"current_boot_mode": "bios", "pxe_interface": "52:54:00:4e:3d:30"},
       "hostname": "localhost", "future_field": 1},
     "boot_interface": "01-52-54-00-4e-3d-30",
     "configuration": {"collectors": ["default", "logs"]},
     "error": null, "logs": "H4sI"}"#;

    #[test]
    fn parses_the_ipa_sample_and_keeps_unknown_fields() {
        let d = IntrospectionData::parse(SAMPLE.as_bytes()).unwrap();
        let inv = d.inventory_checked().unwrap();
        assert_eq!(
            inv.interfaces[0].mac_address.as_deref(),
            Some("52:54:00:4e:3d:30")
        );
        assert_eq!(inv.cpu.as_ref().unwrap().count, Some(2));
        assert_eq!(inv.memory.as_ref().unwrap().physical_mb, Some(2048));
        assert_eq!(inv.disks[0].size, 13958643712);
        assert_eq!(inv.boot.as_ref().unwrap().current_boot_mode, "bios");
        assert_eq!(inv.extra["future_field"], 1);
        assert!(d.extra.contains_key("configuration"));
        // Round trip keeps everything.
        let again: Value = serde_json::to_value(&d).unwrap();
        assert_eq!(again["inventory"]["future_field"], 1);
        assert_eq!(again["configuration"]["collectors"][0], "default");
    }

    #[test]
    fn bad_bodies_are_explained() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON"),
            ("[1,2]", "must be a JSON object"),
            (
                r#"{"inventory": {"interfaces": "eth0"}}"#,
                "not valid JSON of the IPA shape",
            ),
            (
                r#"{"inventory": {"interfaces": [{"name": "eth0"}], "disks": {"sda": 1}}}"#,
                "not valid JSON of the IPA shape",
            ),
        ];
        for (body, want) in cases {
            let e = IntrospectionData::parse(body.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
        let none = IntrospectionData::parse(b"{}").unwrap();
        assert_eq!(
            none.inventory_checked().unwrap_err().to_string(),
            "Hardware inventory is empty or missing"
        );
        let empty = IntrospectionData::parse(br#"{"inventory": {"interfaces": []}}"#).unwrap();
        assert_eq!(
            empty.inventory_checked().unwrap_err().to_string(),
            "No network interfaces provided"
        );
    }

    /// Inspector's hooks `int()` and `str()` what they read (`plugins/standard.py`,
    /// `SchedulerHook`: `int(inventory['cpu']['count'])`) and skip what they cannot read with
    /// a warning: such bodies are processed, not refused.
    #[test]
    fn scalars_are_read_as_inspectors_hooks_read_them() {
        let d = IntrospectionData::parse(
            br#"{"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:00:00:01",
                  "speed_mbps": "1000", "has_carrier": "true", "lldp": "garbage"},
                 {"mac_address": "52:54:00:00:00:02"}],
               "cpu": {"count": "4", "architecture": "x86_64", "socket_count": 1.0, "flags": ["vmx", 3]},
               "memory": {"physical_mb": " 2048 ", "total": "lots"},
               "disks": [{"name": "/dev/sda", "size": "1000204886016", "rotational": 1, "serial": 1234}],
               "boot": {"current_boot_mode": "uefi"}, "system_vendor": "Dell",
               "bmc_address": "10.0.0.5"},
              "error": null, "root_disk": "sda"}"#,
        )
        .unwrap();
        let inv = d.inventory_checked().unwrap();
        let cpu = inv.cpu.as_ref().unwrap();
        assert_eq!((cpu.count, cpu.socket_count), (Some(4), Some(1)));
        assert_eq!(cpu.flags, ["vmx", "3"]);
        let mem = inv.memory.as_ref().unwrap();
        assert_eq!((mem.physical_mb, mem.total), (Some(2048), None));
        assert_eq!(inv.disks[0].size, 1_000_204_886_016);
        assert!(inv.disks[0].rotational);
        assert_eq!(inv.disks[0].serial.as_deref(), Some("1234"));
        assert_eq!(inv.interfaces[0].speed_mbps, Some(1000));
        assert!(inv.interfaces[0].has_carrier);
        assert_eq!(inv.interfaces[0].lldp, None);
        assert_eq!(
            inv.interfaces[1].name, "",
            "a nameless interface is skipped later"
        );
        assert_eq!(inv.system_vendor, None);
        assert_eq!(d.root_disk, None);
        let four = IntrospectionData::parse(
            br#"{"inventory": {"interfaces": [{"name": "eth0"}], "cpu": {"count": "four"}}}"#,
        )
        .unwrap();
        assert_eq!(four.inventory.unwrap().cpu.unwrap().count, None);
    }

    #[test]
    fn macs_are_normalised() {
        assert_eq!(
            normalise_mac("01-52-54-00-4E-3D-30").as_deref(),
            Some("52:54:00:4e:3d:30")
        );
        assert_eq!(
            normalise_mac("52:54:00:4E:3D:30").as_deref(),
            Some("52:54:00:4e:3d:30")
        );
        assert_eq!(
            normalise_mac("52-54-00-4e-3d-30").as_deref(),
            Some("52:54:00:4e:3d:30")
        );
        assert_eq!(normalise_mac("nonsense"), None);
        assert_eq!(normalise_mac("52:54:00:4e:3d"), None);
    }
}
