//! Lease and node records read back from the store (a corrupted or hand-edited store must give
//! an error, not a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(lease) = serde_json::from_slice::<paddock_dhcp::Lease>(data) {
        let again = serde_json::to_vec(&lease).unwrap();
        assert_eq!(
            serde_json::from_slice::<paddock_dhcp::Lease>(&again).unwrap(),
            lease
        );
    }
    let _ = serde_json::from_slice::<paddock_inspector::node::Node>(data);
});
