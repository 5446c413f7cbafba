//! The `pci-devices` collector: `pci_devices: [{"vendor_id": "8086", "product_id": "1521"}, …]`
//! at the top level of the introspection data (IPA's shape; Inspector's `pci_devices` hook
//! counts them against its aliases).

use std::path::Path;

use serde_json::{Value, json};

use super::{CollectError, list, read_opt};

pub fn collect(root: &Path) -> Result<Value, CollectError> {
    let mut out = Vec::new();
    for dev in list(root, "/sys/bus/pci/devices")? {
        let f = |n: &str| {
            read_opt(root, &format!("/sys/bus/pci/devices/{dev}/{n}"))
                .map(|s| s.trim_start_matches("0x").to_string())
        };
        if let (Some(v), Some(p)) = (f("vendor"), f("device")) {
            out.push(json!({"vendor_id": v, "product_id": p}));
        }
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::fixture::write;

    #[test]
    fn pci_ids_without_0x() {
        let t = tempfile::tempdir().unwrap();
        write(
            t.path(),
            "/sys/bus/pci/devices/0000:00:03.0/vendor",
            "0x1af4\n",
        );
        write(
            t.path(),
            "/sys/bus/pci/devices/0000:00:03.0/device",
            "0x1000\n",
        );
        write(
            t.path(),
            "/sys/bus/pci/devices/0000:00:01.0/vendor",
            "0x8086\n",
        );
        write(
            t.path(),
            "/sys/bus/pci/devices/0000:00:01.0/device",
            "0x7000\n",
        );
        write(
            t.path(),
            "/sys/bus/pci/devices/0000:00:02.0/vendor",
            "0x1234\n",
        ); // no device file: skipped
        assert_eq!(
            collect(t.path()).unwrap(),
            json!([{"vendor_id": "8086", "product_id": "7000"}, {"vendor_id": "1af4", "product_id": "1000"}])
        );
    }
}
