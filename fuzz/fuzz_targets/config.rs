//! Configuration files: any text gives a configuration or a list of problems, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock::config::FileConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(file) = FileConfig::parse(text)
        && let Err(e) = file.validate()
    {
        assert!(!e.problems.is_empty());
    }
});
