//! Filter files, trigger files and the MDB (uploaded with images, read from the store): no
//! panic; what parses round-trips (filters and triggers through serde_json, the MDB through
//! its own JSON).
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_image::{Filter, Mdb, Triggers};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(f) = Filter::parse(text) {
        let json = serde_json::to_string(&f).unwrap();
        let back: Filter = serde_json::from_str(&json).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.matches("/etc/passwd"), f.matches("/etc/passwd"));
    }
    if let Ok(t) = Triggers::parse(text) {
        let json = serde_json::to_string(&t).unwrap();
        let back: Triggers = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }
    if let Ok(m) = Mdb::parse(text) {
        assert_eq!(Mdb::parse(&m.to_json()), Ok(m));
    }
});
