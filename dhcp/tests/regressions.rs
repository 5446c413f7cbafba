//! Inputs the fuzzer once crashed on: each must now be refused (or decoded) without a panic.

#[test]
fn fuzzer_findings_are_refused_cleanly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let result = paddock_dhcp::packet::decode_request(&bytes);
        assert!(result.is_err(), "{} should be refused", path.display());
        n += 1;
    }
    assert!(n > 0, "no regression inputs found in {dir}");
}
