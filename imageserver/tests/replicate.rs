//! Replication between two image servers that share one store (as hosts share etcd) and
//! keep their own object stores: the second fetches what it lacks from the first over real
//! HTTP (`ObjectServer.GetObjects` on a loopback port), verifies every object, and a peer
//! that is down or lacks the objects is passed over for one that has them.

use std::sync::Arc;

use paddock_imageserver::api::{ImageServerState, router};
use paddock_imageserver::images::ImageServer;
use paddock_imageserver::mdb::MdbService;
use paddock_imageserver::objects::ObjectStore;
use paddock_imageserver::replicate::{Pass, Replicator};
use paddock_store::{SqliteStore, Store};

mod support;
use support::{add, base_files, tarball};

/// A host: its own object store, the shared store, its image server on a loopback port.
async fn host(
    dir: &std::path::Path,
    name: &str,
    store: Arc<dyn Store>,
    serve: bool,
) -> (Arc<ImageServer>, String) {
    let objects = Arc::new(ObjectStore::open(dir.join(name)).unwrap());
    let images = ImageServer::new(store.clone(), objects);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    if serve {
        let app = router(ImageServerState {
            images: images.clone(),
            mdb: MdbService::new(store, None),
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    (images, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_fetches_every_object_it_lacks_from_a_peer_that_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("store.db")).unwrap());
    let (a, a_url) = host(dir.path(), "a", store.clone(), true).await;
    // A peer that is down (bound, never served: the port refuses once dropped) and one that
    // serves but holds nothing.
    let (_down, down_url) = host(dir.path(), "down", store.clone(), false).await;
    let (_empty, empty_url) = host(dir.path(), "empty", store.clone(), true).await;
    let (b, _) = host(dir.path(), "b", store.clone(), false).await;

    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut files = base_files();
    files.push(("usr/lib/big", big));
    for i in 0..700 {
        files.push((
            Box::leak(format!("usr/share/f{i}").into_boxed_str()),
            format!("file {i}\n").into_bytes(),
        ));
    }
    add(&a, "base", tarball(&files), None).await.unwrap();

    // Before: b knows the record (shared store) but holds none of its objects.
    let detail = b.show("base").await;
    assert!(
        detail.is_err(),
        "b cannot even read the tree yet: {detail:?}"
    );

    let r = Replicator::new(b.clone(), vec![down_url, empty_url, a_url]);
    let pass = r.pass().await.expect("replicated");
    // 703 files; the tree is one more object.
    assert_eq!(pass.images, 1, "{pass:?}");
    assert_eq!(pass.objects, 704, "{pass:?}");
    assert!(pass.bytes > 3_000_000, "{pass:?}");
    let detail = b.show("base").await.unwrap();
    assert_eq!(detail.missing_objects, 0, "{detail:?}");
    assert!(
        b.check("base").await.unwrap().is_empty(),
        "every object verifies"
    );
    let want = a.get("base").await.unwrap();
    assert_eq!(b.get("base").await.unwrap().fs, want.fs);

    // A second pass has nothing to do.
    assert_eq!(r.pass().await.unwrap(), Pass::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_peer_holding_the_objects_the_pass_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("store.db")).unwrap());
    let (a, _) = host(dir.path(), "a", store.clone(), false).await;
    let (_empty, empty_url) = host(dir.path(), "empty", store.clone(), true).await;
    let (b, _) = host(dir.path(), "b", store.clone(), false).await;
    let files = base_files();
    add(&a, "lonely", tarball(&files), None).await.unwrap();
    let err = Replicator::new(b.clone(), vec![empty_url])
        .pass()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"lonely\"") && err.contains("could not be had from any peer"),
        "{err}"
    );
    assert!(b.get("lonely").await.is_err(), "nothing half-made on b");
}
