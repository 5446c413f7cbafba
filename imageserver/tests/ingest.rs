//! Tar ingest against hand-made archives, hostile ones included, and the real Debian
//! minbase tarball when scripts/test-images.sh has built it.

use std::io::Write;
use std::path::Path;

use paddock_image::{Filter, Inode, ObjectId, SpecialKind};
use paddock_imageserver::ingest::{IngestError, ingest};
use paddock_imageserver::objects::ObjectStore;

/// One 512-byte ustar header (fields written by hand, so hostile values are possible).
fn header(name: &[u8], kind: u8, size: u64, link: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14500000000\0");
    h[156] = kind;
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if kind == b'3' || kind == b'4' {
        h[329..337].copy_from_slice(b"0000004\0");
        h[337..345].copy_from_slice(b"0000001\0");
    }
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// `m` (a member) with `bytes` written into its header at `at`, its checksum made right again.
fn patched(mut m: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    m[at..at + bytes.len()].copy_from_slice(bytes);
    m[148..156].copy_from_slice(b"        ");
    let sum: u32 = m[..512].iter().map(|b| u32::from(*b)).sum();
    m[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    m
}

fn member(name: &str, kind: u8, data: &[u8], link: &str) -> Vec<u8> {
    let mut v = header(name.as_bytes(), kind, data.len() as u64, link.as_bytes());
    v.extend_from_slice(data);
    v.resize(v.len().next_multiple_of(512), 0);
    v
}

fn archive(members: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = members.concat();
    v.extend_from_slice(&[0u8; 1024]);
    v
}

fn good() -> Vec<u8> {
    archive(&[
        member("./", b'5', b"", ""),
        member("./etc/", b'5', b"", ""),
        member("./etc/passwd", b'0', b"root:x:0:0\n", ""),
        member("./etc/passwd-", b'1', b"", "./etc/passwd"),
        member("./etc/empty", b'0', b"", ""),
        member("./etc/copy", b'0', b"root:x:0:0\n", ""),
        member("./lib", b'2', b"", "usr/lib"),
        member("./usr/lib/x", b'0', b"lib bytes", ""),
        member("./dev/null", b'3', b"", ""),
        member("./run/fifo", b'6', b"", ""),
        member("./tmp/junk", b'0', b"filtered", ""),
        member("./.subd/objects/x", b'0', b"never", ""),
    ])
}

#[test]
fn a_good_archive_becomes_a_tree_and_objects() {
    let d = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(d.path().join("store")).unwrap();
    let filter = Filter::parse("/tmp/.*\n").unwrap();
    let mut calls = 0;
    let (fs, st) = ingest(&good()[..], &store, Some(&filter), &mut |_| calls += 1).unwrap();
    assert!(calls >= 1);
    let obj = ObjectId::of(b"root:x:0:0\n");
    assert_eq!(fs.get("/etc/passwd").unwrap().object(), Some(obj));
    assert_eq!(
        fs.paths["/etc/passwd"], fs.paths["/etc/passwd-"],
        "hard link"
    );
    assert_ne!(
        fs.paths["/etc/passwd"], fs.paths["/etc/copy"],
        "same bytes, own inode"
    );
    assert_eq!(fs.get("/etc/empty").unwrap().object(), None);
    assert!(matches!(fs.get("/lib"), Some(Inode::Symlink { target, .. }) if target == "usr/lib"));
    assert!(fs.get("/usr").unwrap().is_dir(), "implicit parent");
    assert!(matches!(
        fs.get("/dev/null"),
        Some(Inode::Special { special: SpecialKind::Char, rdev, .. }) if *rdev == nix::sys::stat::makedev(4, 1)
    ));
    assert!(matches!(
        fs.get("/run/fifo"),
        Some(Inode::Special {
            special: SpecialKind::Fifo,
            ..
        })
    ));
    assert!(fs.get("/tmp/junk").is_none() && fs.get("/.subd/objects/x").is_none());
    assert_eq!(st.filtered, 2);
    assert_eq!(
        (st.files, st.hardlinks, st.symlinks, st.specials),
        (4, 1, 1, 2)
    );
    assert_eq!((st.objects, st.new_objects), (2, 2));
    assert_eq!(
        st.dedup_bytes, 11,
        "the second copy of passwd is not stored again"
    );
    assert_eq!(store.list().unwrap().len(), 2);
    // Again: nothing new.
    let (fs2, st2) = ingest(&good()[..], &store, Some(&filter), &mut |_| {}).unwrap();
    assert_eq!(fs2, fs);
    assert_eq!(st2.new_objects, 0);
}

#[test]
fn compressed_archives_are_detected() {
    let d = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(d.path()).unwrap();
    let plain = good();
    let (want, _) = ingest(&plain[..], &store, None, &mut |_| {}).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let gz = gz.finish().unwrap();
    assert_eq!(ingest(&gz[..], &store, None, &mut |_| {}).unwrap().0, want);
    let zst = zstd::stream::encode_all(&plain[..], 3).unwrap();
    assert_eq!(ingest(&zst[..], &store, None, &mut |_| {}).unwrap().0, want);
}

fn refused(bytes: &[u8], expect: &str) {
    let d = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(d.path().join("store")).unwrap();
    let err = ingest(bytes, &store, None, &mut |_| {}).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(expect), "wanted {expect:?} in: {text}");
    // Nothing outside the store, and inside it only objects (named by hash) and tmp/.
    let outside: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, vec![std::ffi::OsString::from("store")]);
    assert_only_objects(&d.path().join("store"));
}

fn assert_only_objects(store: &Path) {
    for e in walk(store) {
        let rel = e.strip_prefix(store).unwrap().to_str().unwrap().to_string();
        if e.is_file() {
            let obj = rel.strip_prefix("objects/").and_then(ObjectId::from_path);
            assert!(obj.is_some(), "a non-object file in the store: {rel}");
            assert_eq!(
                ObjectId::of(&std::fs::read(&e).unwrap()),
                obj.unwrap(),
                "{rel}"
            );
        }
    }
}

fn walk(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap().path();
        if e.is_dir() {
            out.extend(walk(&e));
        }
        out.push(e);
    }
    out
}

#[test]
fn hostile_archives_are_refused_and_write_nothing_outside_the_store() {
    let ok = member("./a", b'0', b"fine", "");
    // (members, what the refusal says)
    let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
        (
            vec![ok.clone(), member("../etc/passwd", b'0', b"x", "")],
            "`..`",
        ),
        (vec![member("a/../../x", b'0', b"x", "")], "`..`"),
        (vec![member("/etc/passwd", b'0', b"x", "")], "absolute path"),
        (vec![member("./x", b'2', b"", "../../etc")], "climbs above"),
        (
            vec![member("./d/x", b'2', b"", "../../etc/shadow")],
            "climbs above",
        ),
        (vec![member("./x", b'1', b"", "../outside")], "escapes"),
        (vec![member("./x", b'1', b"", "/etc/passwd")], "absolute"),
        (
            vec![member("./x", b'1', b"", "./nowhere")],
            "not earlier in the archive",
        ),
        (
            vec![member("./x", b'2', b"", "")],
            "symlink without a target",
        ),
        (vec![ok.clone(), ok.clone()], "already in the tree"),
        (
            vec![
                member("./a", b'0', b"x", ""),
                member("./a/b", b'0', b"y", ""),
            ],
            "not a directory",
        ),
        (vec![member("./s", b'S', b"", "")], "GNU sparse"),
        (
            vec![member("./s", b'V', b"", "")],
            "unsupported member type",
        ),
        (
            vec![member("./\u{0}", b'0', b"", "")],
            "already in the tree",
        ),
    ];
    for (members, why) in &cases {
        refused(&archive(members), why);
    }
    let mut latin1 = header(b"./caf\xe9", b'0', 1, b"");
    latin1.extend_from_slice(&[b'x'; 512]);
    refused(&archive(&[latin1]), "not UTF-8");
    // Giant extension headers are refused before they are read.
    let mut giant = header(b"././@LongLink", b'L', 64 << 20, b"");
    giant.extend_from_slice(&[b'a'; 4096]);
    refused(&giant, "extension header of 67108864 bytes");
    let mut giant = header(b"./PaxHeaders/x", b'x', 2 << 20, b"");
    giant.extend_from_slice(&[b'a'; 4096]);
    refused(&giant, "extension header of 2097152 bytes");
    // A long name that is fine, then a PAX size that disagrees with the header.
    let long = "d/".repeat(80) + "f";
    let mut l = member("././@LongLink", b'L', format!("{long}\0").as_bytes(), "");
    l.extend(member("ignored", b'0', b"x", ""));
    let d = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(d.path()).unwrap();
    let (fs, _) = ingest(&archive(&[l])[..], &store, None, &mut |_| {}).unwrap();
    assert!(fs.get(&format!("/{long}")).is_some(), "GNU long names work");
    let pax = member("./PaxHeaders/x", b'x', b"11 size=99\n", "");
    refused(
        &archive(&[pax, member("./x", b'0', b"x", "")]),
        "PAX size 99 disagrees",
    );
    let pax = member("./PaxHeaders/x", b'x', b"99 path=x\n", "");
    refused(&archive(&[pax, member("./x", b'0', b"x", "")]), "PAX");
    let pax = member("./PaxHeaders/x", b'x', b"13 path=/abs\n", "");
    refused(
        &archive(&[pax, member("./x", b'0', b"x", "")]),
        "absolute path",
    );
    refused(
        &archive(&[member("./PaxHeaders/x", b'x', b"8 path=\n", "")]),
        "ends after an extension header",
    );
    // Truncated: in a member's data, in a header, and nothing at all.
    let full = archive(&[member("./big", b'0', &[7u8; 5000], "")]);
    refused(&full[..3000], "truncated");
    refused(&full[..300], "unreadable header");
    refused(&[], "no members");
    refused(
        b"this is not a tar archive at all, just some text that goes on and on",
        "",
    );
    let mut bad_sum = member("./a", b'0', b"x", "");
    bad_sum[148] = b'7';
    refused(&archive(&[bad_sum]), "unreadable header");
    // Numbers that do not read: a time, and a device's major number.
    refused(
        &archive(&[patched(
            member("./a", b'0', b"x", ""),
            136,
            b"1450000zzzz\0",
        )]),
        "bad mtime",
    );
    refused(
        &archive(&[patched(member("./dev/x", b'3', b"", ""), 329, b"00zz004\0")]),
        "bad device major number",
    );
    // A gzip stream cut short.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&full).unwrap();
    let gz = gz.finish().unwrap();
    refused(&gz[..gz.len() / 2], "");
    match ingest(
        &b"garbage garbage garbage"[..],
        &ObjectStore::open(d.path().join("s2")).unwrap(),
        None,
        &mut |_| {},
    ) {
        Err(IngestError::Member { .. }) | Err(IngestError::Io(_)) => {}
        other => panic!("garbage accepted: {other:?}"),
    }
}

#[test]
fn the_debian_minbase_tarball() {
    let tar = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images/minbase.tar");
    if !tar.exists() {
        panic!(
            "{} is missing: run scripts/test-images.sh (scripts/test.sh does)",
            tar.display()
        );
    }
    let d = tempfile::tempdir().unwrap();
    let store = ObjectStore::open(d.path()).unwrap();
    let t = std::time::Instant::now();
    let (fs, st) = ingest(
        std::fs::File::open(&tar).unwrap(),
        &store,
        None,
        &mut |_| {},
    )
    .unwrap();
    println!("minbase: {st:?} in {:?}", t.elapsed());
    fs.validate().unwrap();
    assert!(fs.get("/etc/passwd").is_some() && fs.get("/usr/bin").unwrap().is_dir());
    assert!(matches!(fs.get("/bin"), Some(Inode::Symlink { target, .. }) if target == "usr/bin"));
    assert!(st.files > 3000, "{st:?}");
    assert_eq!(st.new_objects as usize, store.list().unwrap().len());
    assert_eq!(st.objects, st.new_objects);
    // Every object is exactly the bytes of its file (spot check via /etc/debian_version).
    let want = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images/minbase/etc/debian_version"),
    )
    .unwrap();
    assert_eq!(
        fs.get("/etc/debian_version").unwrap().object(),
        Some(ObjectId::of(&want))
    );
}
