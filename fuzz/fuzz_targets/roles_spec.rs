//! Role spec files: any text gives a spec or a list of problems (each naming a line of the
//! file), never a panic; a valid spec's plan over a small census is deterministic, and once
//! carried out gives an empty plan.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_roles::{Census, Host, Spec, applied, plan};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Spec::parse("fuzz.toml", text) {
        Err(e) => {
            assert!(!e.0.is_empty());
            let lines = text.lines().count().max(1);
            for p in &e.0 {
                assert!(p.line >= 1 && p.line <= lines + 1, "{p}");
            }
        }
        Ok(spec) => {
            let census = Census {
                hosts: (0..6)
                    .map(|i| Host {
                        name: format!("h{i}"),
                        ..Host::default()
                    })
                    .collect(),
                ..Census::default()
            };
            let first = plan(&spec, &census);
            assert_eq!(plan(&spec, &census), first);
            let after = applied(&census, &first);
            assert!(plan(&spec, &after).actions.is_empty());
        }
    }
});
