//! `/v1/continue` bodies: parsing, then the pre-processing hooks that run before lookup and
//! the post-processing hooks, with no panic whatever the shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_inspector::hooks;
use paddock_inventory::IntrospectionData;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = IntrospectionData::parse(data) else {
        return;
    };
    let _ = hooks::ramdisk_error(&d);
    let Ok(inv) = d.inventory_checked() else {
        return;
    };
    let Ok(ifaces) = hooks::validate_interfaces(&d, inv) else {
        return;
    };
    let hints = d.extra.get("hints");
    if let Ok(root) = hooks::root_disk_selection(&d, inv, hints) {
        let raw: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
        let processed = hooks::processed(&raw, &ifaces, root.as_ref(), hints.is_some(), true);
        let _ = hooks::properties(&processed);
    }
});
