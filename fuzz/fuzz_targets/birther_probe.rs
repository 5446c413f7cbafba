//! What the birther reads in the ramdisk: `sfdisk --json` and `blkid -o export` output from a
//! disk that may hold anything (`<sfdisk json> NUL <blkid export>`, each also fed whole), and
//! the events agents post (`Event` JSON, applied to a record in every state): no panic; a
//! parsed table round-trips through serde_json; a re-image keeps only the planned root; every
//! transition's record reads back as written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use paddock_birther::probe::{self, PartitionTable, Reuse};
use paddock_birther::state::{Event, Operation, Provisioning, Run, State, Step};
use paddock_birther::{Firmware, Geometry, plan};

fuzz_target!(|data: &[u8]| {
    let layout = plan(
        "/dev/vda",
        Geometry {
            size_bytes: 2 << 30,
            logical_sector: 512,
            physical_sector: 512,
        },
        Firmware::Uefi,
    )
    .unwrap();
    let (left, right) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, data),
    };
    let table = probe::parse_sfdisk_json(left).ok();
    if let Some(t) = &table {
        for p in &t.partitions {
            assert!(p.start.checked_add(p.size).is_some());
        }
        let json = serde_json::to_string(t).unwrap();
        assert_eq!(&serde_json::from_str::<PartitionTable>(&json).unwrap(), t);
        let _ = probe::mismatch(&layout, t);
    }
    let signatures = probe::parse_blkid_export(right).unwrap_or_default();
    assert!(signatures.iter().all(|s| !s.tags.is_empty()));
    if let Reuse::Root { device } = probe::reuse(&layout, table.as_ref(), &signatures) {
        assert_eq!(device, layout.root.device);
        assert!(table.is_some_and(|t| probe::mismatch(&layout, &t).is_none()));
    }

    let Ok(event) = serde_json::from_slice::<Event>(data) else {
        return;
    };
    let run = |synced| Run {
        image: "debian/a".into(),
        previous_image: None,
        last_step: Some(Step::Register),
        synced,
    };
    let states = [
        State::Unknown,
        State::Birth(run(false)),
        State::Rebirth(run(true)),
        State::Healthy {
            image: "debian/a".into(),
        },
        State::Clean { last_step: None },
        State::Error {
            operation: Operation::Birth,
            step: Step::Sync,
            message: "fetch failed".into(),
            image: Some("debian/a".into()),
        },
    ];
    for state in states {
        let before = Provisioning {
            state,
            since_ms: 1,
            updated_ms: 2,
            started_ms: None,
        };
        if let Ok(t) = before.apply(&event, 3) {
            assert_eq!(t.serve, t.record.serve());
            if !t.changed {
                assert_eq!(t.record, before);
            }
            let json = serde_json::to_string(&t.record).unwrap();
            assert_eq!(
                serde_json::from_str::<Provisioning>(&json).unwrap(),
                t.record
            );
        }
    }
});
