//! The image index over the real SQLite store and object store: names, tombstones, expiry,
//! garbage collection that waits for adds, and 100 concurrent adds sharing objects.

use std::io::Read;
use std::sync::Arc;

use paddock_image::{Filter, ObjectId};
use paddock_imageserver::images::{ImageError, ImageServer};
use paddock_imageserver::objects::ObjectStore;
use paddock_store::SqliteStore;

mod support;
use support::{add, base_files, tarball};

/// Longest wait for something that must happen.
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn full_image(extra: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut files = base_files();
    files.extend(extra.iter().cloned());
    tarball(&files)
}

struct Env {
    _dir: tempfile::TempDir,
    server: Arc<ImageServer>,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("store.db")).unwrap());
    let objects = Arc::new(ObjectStore::open(dir.path().join("objects")).unwrap());
    Env {
        server: ImageServer::new(store, objects),
        _dir: dir,
    }
}

#[tokio::test]
async fn names_are_never_reused_and_deleted_objects_are_collected() {
    let e = env();
    let s = &e.server;
    let filter = Some(Filter::parse("/tmp/.*\n").unwrap());
    // A full image with the filter and one file of its own.
    let with_own = |name: &'static str, path: &'static str, content: &[u8]| {
        add(
            s,
            name,
            full_image(&[(path, content.to_vec())]),
            filter.clone(),
        )
    };
    let a = with_own("base.0", "opt/a", b"only in a").await.unwrap();
    assert_eq!(a.stats.new_objects, 3);
    let b = with_own("base.1", "opt/b", b"only in b").await.unwrap();
    assert_eq!((b.stats.new_objects, b.stats.dedup_bytes), (1, 26 + 9));
    assert!(matches!(
        add(s, "base.1", full_image(&[]), filter.clone()).await,
        Err(ImageError::Exists(_))
    ));
    assert!(matches!(
        add(s, "/bad", full_image(&[]), None).await,
        Err(ImageError::Name(_))
    ));
    // A full image needs /etc/passwd and /usr/bin; a sparse one (no filter) does not.
    let err = add(s, "x", tarball(&[("opt/x", b"x".to_vec())]), filter.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/etc"), "{err}");
    add(s, "sparse", tarball(&[("opt/x", b"x".to_vec())]), None)
        .await
        .unwrap();

    let show = s.show("base.0").await.unwrap();
    assert_eq!(
        (
            show.unique_objects,
            show.shared_objects,
            show.missing_objects
        ),
        (1, 2, 0)
    );
    let img = s.get("base.1").await.unwrap();
    assert!(img.fs.get("/opt/b").is_some());
    assert_eq!(img.filter, filter);

    s.delete("base.0", 2_000).await.unwrap();
    assert!(matches!(
        s.get("base.0").await,
        Err(ImageError::NotFound(_))
    ));
    assert!(matches!(
        add(s, "base.0", full_image(&[]), filter.clone()).await,
        Err(ImageError::NameRetired(_))
    ));
    assert!(
        s.list()
            .await
            .unwrap()
            .iter()
            .any(|r| r.name == "base.0" && r.deleted),
        "a tombstone stays"
    );
    let only_a = ObjectId::of(b"only in a");
    assert!(s.objects().contains(&only_a));
    let gc = s.collect_garbage().await.unwrap();
    assert_eq!(
        gc.deleted_objects, 2,
        "the object only base.0 used, and base.0's tree"
    );
    assert!(!s.objects().contains(&only_a));
    assert!(s.check("base.1").await.unwrap().is_empty());
    // Corruption is found by a check.
    std::fs::write(s.objects().path(&ObjectId::of(b"only in b")), b"rot").unwrap();
    assert_eq!(s.check("base.1").await.unwrap().len(), 1);

    // Expiry removes the image entirely (its name may be reused, as in Dominator).
    s.set_expiry("sparse", Some(5_000)).await.unwrap();
    assert!(s.expire(4_999).await.unwrap().is_empty());
    assert_eq!(s.expire(5_000).await.unwrap(), vec!["sparse".to_string()]);
    assert!(s.record("sparse").await.unwrap().is_none());
    add(s, "sparse", tarball(&[("opt/y", b"y".to_vec())]), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_refused_tarball_records_nothing() {
    let e = env();
    let mut evil = full_image(&[]);
    evil.truncate(700);
    let err = add(&e.server, "evil", evil, None).await.unwrap_err();
    assert!(err.to_string().contains("tarball was refused"), "{err}");
    assert!(e.server.record("evil").await.unwrap().is_none());
}

/// A reader fed chunk by chunk from the test, to hold an add in flight; it says when it is
/// first read (the add then holds its share of the GC lock).
struct Fed(
    std::sync::mpsc::Receiver<Vec<u8>>,
    Vec<u8>,
    Option<tokio::sync::oneshot::Sender<()>>,
);

impl Read for Fed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(reading) = self.2.take() {
            let _ = reading.send(());
        }
        if self.1.is_empty() {
            match self.0.recv() {
                Ok(v) => self.1 = v,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.1.len());
        buf[..n].copy_from_slice(&self.1[..n]);
        self.1.drain(..n);
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_waits_for_an_add_in_flight() {
    let e = env();
    let s = e.server.clone();
    let tar = full_image(&[("opt/slow", vec![9u8; 300_000])]);
    let (tx, rx) = std::sync::mpsc::channel();
    let (reading_tx, reading) = tokio::sync::oneshot::channel();
    let adding = {
        let s = s.clone();
        tokio::spawn(async move {
            s.add(
                "slow".into(),
                Box::new(Fed(rx, Vec::new(), Some(reading_tx))),
                None,
                paddock_image::Triggers::default(),
                String::new(),
                None,
                Box::new(|_| {}),
                1,
            )
            .await
        })
    };
    // Half the archive: the add is reading it, the image is not recorded yet.
    tx.send(tar[..tar.len() / 2].to_vec()).unwrap();
    tokio::time::timeout(WAIT, reading)
        .await
        .expect("the add never read its tarball")
        .unwrap();
    let mut waiting = s.gc_waiting();
    let gc = {
        let s = s.clone();
        tokio::spawn(async move { s.collect_garbage().await })
    };
    tokio::time::timeout(WAIT, waiting.wait_for(|n| *n == 1))
        .await
        .expect("the collection never waited for the add in flight")
        .unwrap();
    assert!(!gc.is_finished(), "GC must wait while an add is in flight");
    tx.send(tar[tar.len() / 2..].to_vec()).unwrap();
    drop(tx);
    adding.await.unwrap().unwrap();
    let report = gc.await.unwrap().unwrap();
    assert_eq!(report.deleted_objects, 0);
    assert!(
        s.check("slow").await.unwrap().is_empty(),
        "every object of the new image survived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_adds_store_each_object_once() {
    let e = env();
    let shared: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("usr/lib/shared{i}"),
                format!("shared object {i} ").repeat(100).into_bytes(),
            )
        })
        .collect();
    let mut tasks = Vec::new();
    for n in 0..100 {
        let mut files: Vec<(&str, Vec<u8>)> = shared
            .iter()
            .map(|(p, d)| (p.as_str(), d.clone()))
            .collect();
        let unique = format!("unique to image {n}").into_bytes();
        files.push(("etc/hostname", unique));
        let tar = full_image(&files);
        let s = e.server.clone();
        tasks.push(tokio::spawn(async move {
            add(&s, &format!("img.{n}"), tar, None).await
        }));
    }
    let mut new_objects = 0;
    for t in tasks {
        new_objects += t.await.unwrap().unwrap().stats.new_objects;
    }
    // 40 shared + passwd + true, and one unique object per image.
    assert_eq!(
        new_objects,
        42 + 100,
        "each object counted new exactly once"
    );
    let stored = e.server.objects().list().unwrap();
    // Plus 100 distinct trees.
    assert_eq!(stored.len(), 42 + 100 + 100);
    assert_eq!(e.server.list().await.unwrap().len(), 100);
    for (id, _) in &stored {
        assert!(e.server.objects().verify(id).unwrap());
    }
}
