//! What the image server's test files share: tarballs built in memory and adding one as an
//! image with the defaults the tests do not vary.

#![allow(dead_code)]

use std::sync::Arc;

use paddock_image::{Filter, Triggers};
use paddock_imageserver::images::{AddSummary, ImageError, ImageServer};

/// The least a full image holds: /etc/passwd and a binary under /usr/bin.
pub fn base_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("etc/passwd", b"root:x:0:0::/root:/bin/sh\n".to_vec()),
        ("usr/bin/true", b"\x7fELF true".to_vec()),
    ]
}

/// A tar of regular files, owned by root with one fixed mtime so that equal input gives
/// equal objects.
pub fn tarball(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// Adds `tar` as image `name` with no triggers and no progress reports.
pub async fn add(
    s: &Arc<ImageServer>,
    name: &str,
    tar: Vec<u8>,
    filter: Option<Filter>,
) -> Result<AddSummary, ImageError> {
    s.add(
        name.into(),
        Box::new(std::io::Cursor::new(tar)),
        filter,
        Triggers::default(),
        "test".into(),
        None,
        Box::new(|_| {}),
        1_000,
    )
    .await
}
