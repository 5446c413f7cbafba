//! Tarballs as uploaded to the image server: `ingest` must refuse or accept them without a
//! panic, and what it accepts must be a valid tree whose objects are all in the store.
//! Raw input reaches the gzip and zstd decoders by their magic; an input whose first byte
//! is even is also fed gzip-wrapped, so the tar parser is exercised behind the decoder too.
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use paddock_imageserver::ingest::ingest;
use paddock_imageserver::objects::ObjectStore;

fn store() -> &'static ObjectStore {
    static STORE: OnceLock<(tempfile::TempDir, ObjectStore)> = OnceLock::new();
    &STORE
        .get_or_init(|| {
            let dir = tempfile::TempDir::new().unwrap();
            let store = ObjectStore::open(dir.path()).unwrap();
            (dir, store)
        })
        .1
}

fn check(input: &[u8]) {
    let store = store();
    if let Ok((fs, _stats)) = ingest(input, store, None, &mut |_| {}) {
        fs.validate().unwrap();
        for (id, size) in fs.objects() {
            assert_eq!(store.size(&id), Some(size), "object {id:?}");
        }
        for p in fs.paths.keys() {
            assert!(!p.split('/').any(|c| c == ".."), "path {p:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.first().is_some_and(|b| b % 2 == 0) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).unwrap();
        check(&gz.finish().unwrap());
    }
});
