//! The real thing: a copy of the Debian minbase tree (`target/images/minbase`, from
//! `scripts/test-images.sh`) turned into the second image (`minbase2`: packages added and
//! upgraded) by a subd over HTTP: scan, plan, Fetch of the missing objects from an object
//! server, Update with triggers; then the rescanned tree is the image's and the files are
//! the image's byte for byte. Prints the change window (`update change window: <ms> ms`).
//! Needs root (the trees are root-owned and hold devices).

mod support;

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use paddock_image::plan::{missing_objects, plan};
use paddock_subd::service::UpdateReport;
use serde_json::json;
use support::*;

fn images() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/images")
}

#[test]
fn minbase_becomes_the_second_image_exactly() {
    let (old, new) = (images().join("minbase"), images().join("minbase2"));
    assert!(
        old.join("etc").is_dir() && new.join("etc").is_dir(),
        "{} is missing: run scripts/test-images.sh (scripts/test.sh does)",
        new.display()
    );
    assert!(
        is_root(),
        "this test needs root: the trees are root-owned and hold devices"
    );
    let d = tempfile::tempdir().unwrap();
    let (root, store) = (d.path().join("root"), d.path().join("store"));
    let st = Command::new("cp")
        .arg("-a")
        .arg(&old)
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "cp -a {}", old.display());

    // The image: minbase2 scanned, its objects in a store directory.
    let t = Instant::now();
    let scan = scan_tree(&new);
    fs::create_dir(&store).unwrap();
    store_objects(&new, &scan.fs, &store);
    let triggers = r#"[
        {"MatchLines": ["/usr/sbin/.*", "/usr/bin/.*"], "Service": "tools"},
        {"MatchLines": ["/etc/.*"], "Service": "config", "DoReload": true},
        {"MatchLines": ["/boot/.*"], "Service": "kernel", "DoReboot": true, "HighImpact": true}
    ]"#;
    let image = image_of("debian/minbase2", scan.fs, triggers);
    println!(
        "image: {} paths, {} objects, {} bytes (scanned and stored in {:.1} s)",
        image.fs.paths.len(),
        image.fs.objects().len(),
        image.fs.total_bytes(),
        t.elapsed().as_secs_f64()
    );

    let log = d.path().join("trigger.log");
    let mut config = test_config(&root);
    config.trigger_command = trigger_command(d.path(), &log, &d.path().join("none"));
    let s = TestSubd::start(config);
    let (server, _) = object_server(&s.rt, &store);
    let c = s.client("dominator");

    let p = c.wait_scan(0);
    let (fs_, cache) = (p.file_system.unwrap(), p.object_cache.unwrap());
    let missing = missing_objects(&fs_, &cache, &image);
    let missing_bytes: u64 = missing
        .iter()
        .map(|o| fs::metadata(store.join(o.path())).unwrap().len())
        .sum();
    let f = c.ok(
        "Subd.Fetch",
        &json!({"server": server, "objects": missing, "speed_percent": 100}),
    );
    assert_eq!(f["stats"]["objects"].as_u64(), Some(missing.len() as u64));
    let p = c.poll(0);
    let req = plan(&p.file_system.unwrap(), &p.object_cache.unwrap(), &image);
    println!(
        "plan: fetched {} objects ({} bytes); copy to cache {}, multiply {}, dirs {}, inodes {}, \
         hard links {}, delete {}, change {}",
        missing.len(),
        missing_bytes,
        req.files_to_copy_to_cache.len(),
        req.multiply_used_objects.len(),
        req.directories_to_make.len(),
        req.inodes_to_make.len(),
        req.hardlinks_to_make.len(),
        req.paths_to_delete.len(),
        req.inodes_to_change.len()
    );
    assert!(req.inodes_to_make.len() > 100, "minbase2 adds packages");
    let r: UpdateReport =
        serde_json::from_value(c.ok("Subd.Update", &serde_json::to_value(&req).unwrap())).unwrap();
    assert!(r.error.is_none(), "{:?}", r.apply.errors);
    println!(
        "update change window: {:.1} ms (prepare {:.1} ms, whole update {:.1} ms; triggers: {})",
        r.apply.change_window_ms,
        r.apply.prepare_ms,
        r.total_ms,
        read_lines(&log).join(", ")
    );
    assert!(read_lines(&log).iter().any(|l| l.starts_with("tools stop")));

    // The tree is the image's, byte for byte.
    let after = c.fresh_scan();
    assert_same_tree(&after.file_system.unwrap(), &image.fs);
    let n = assert_same_dirs(&root, &new);
    println!("compared {n} paths with minbase2: identical");
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
    let again = plan(&after_fs(&c), &Default::default(), &image);
    assert!(again.is_empty(), "a second plan has work: {again:?}");
}

fn after_fs(c: &Client) -> paddock_image::FileSystem {
    c.poll(0).file_system.unwrap()
}
