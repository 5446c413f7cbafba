//! What a switch sends: an Ethernet frame → the agent's LLDP parser → the TLVs read as
//! Inspector's `lldp_basic` reads them, and the switch port the console shows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_inventory::lldp;
use paddock_ramdisk::lldp::parse_frame;

fuzz_target!(|frame: &[u8]| {
    let Ok(tlvs) = parse_frame(frame) else {
        return;
    };
    assert!(tlvs.iter().all(|(t, _)| *t <= 127 && *t != 0));
    let processed = lldp::processed(&tlvs);
    for v in processed.values() {
        if let Some(s) = v.as_str() {
            assert!(!s.chars().any(char::is_control), "{s:?}");
        }
    }
    if let Some((switch, port)) = lldp::switch_port(&tlvs) {
        assert!(!switch.is_empty() && !port.is_empty());
    }
});
