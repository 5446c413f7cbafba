//! File names from TFTP read requests: whatever is accepted stays inside the root.
#![no_main]

use std::path::Component;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(rel) = paddock_tftp::clean_request(name) {
        assert!(rel.is_relative());
        assert!(
            rel.components().all(|c| matches!(c, Component::Normal(_))),
            "{rel:?}"
        );
        assert!(!rel.to_string_lossy().contains('\\'));
    }
});
