//! The permitted-methods and groups extensions as a certificate may carry them (any bytes a
//! CA-signed certificate could hold): no panic; whatever parses round-trips through our
//! encoder; every accepted pattern has exactly one '.', and matching it against any method
//! name terminates without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_security::methods::{
    decode_strings, encode_strings, glob_match, parse_groups, parse_permitted_methods,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(strings) = decode_strings(data) {
        assert_eq!(decode_strings(&encode_strings(&strings)).unwrap(), strings);
    }
    let _ = parse_groups(data);
    if let Ok(perms) = parse_permitted_methods(data) {
        for p in perms.patterns() {
            assert_eq!(p.matches('.').count(), 1, "{p}");
            let _ = glob_match(p, "Subd.Update");
            let _ = perms.allows(p);
        }
    }
    // The bytes as a pattern and as a method name, against each other.
    if let Ok(text) = std::str::from_utf8(data)
        && text.len() <= 256
    {
        let mid = (0..=text.len() / 2)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        let (a, b) = text.split_at(mid);
        let _ = glob_match(a, b);
        let _ = paddock_security::methods::check_pattern(text);
    }
});
