//! MAC addresses as they arrive in URLs (`/boot/{mac}.ipxe`), API bodies and config files.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_inventory::MacAddr;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(mac) = s.parse::<MacAddr>() {
        // Whatever parses prints back to something that parses to the same address.
        assert_eq!(mac.to_string().parse::<MacAddr>().unwrap(), mac);
        assert_eq!(mac.to_hex().parse::<MacAddr>().unwrap(), mac);
    }
});
