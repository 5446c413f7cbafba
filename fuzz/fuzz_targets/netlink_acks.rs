//! Netlink replies from nf_tables: `parse_acks` must not panic on any datagram.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = paddock_firewall::netlink::parse_acks(data);
});
