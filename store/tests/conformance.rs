//! One conformance suite, two backends: every check runs against the embedded SQLite store
//! and against a real etcd (Debian's etcd-server) that the test starts in a network
//! namespace of its own, on a 198.18.0.0/15 address. The test thread enters that namespace
//! before it opens any socket.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_store::election::Election;
use paddock_store::{
    Compare, EtcdStore, Event, EventKind, LeaseId, Op, SqliteStore, Store, StoreError, Txn, Watch,
};

/// etcd in its own namespace; removed on drop.
struct Etcd {
    ns: String,
    child: Child,
    _dir: tempfile::TempDir,
    url: String,
}

impl Etcd {
    fn start(tag: &str) -> Etcd {
        // Short: interface-free, but `ip` keeps names to the file-name limit anyway.
        let ns = format!(
            "pdkst{}-{}",
            std::process::id() % 100_000,
            &tag[..tag.len().min(20)]
        );
        let sh = |c: &str| {
            let ok = Command::new("sh")
                .arg("-c")
                .arg(c)
                .status()
                .unwrap()
                .success();
            assert!(ok, "`{c}` failed (run as root, with iproute2)");
        };
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        sh(&format!("ip netns add {ns}"));
        sh(&format!(
            "ip -n {ns} link set lo up && ip -n {ns} addr add 198.18.250.1/32 dev lo"
        ));
        let dir = tempfile::tempdir().unwrap();
        let ip = "198.18.250.1";
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "etcd", "--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &format!("http://{ip}:2379"),
                "--advertise-client-urls",
                &format!("http://{ip}:2379"),
                "--listen-peer-urls",
                &format!("http://{ip}:2380"),
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
                "--initial-cluster",
                &format!("t=http://{ip}:2380"),
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (apt-get install etcd-server)");
        let e = Etcd {
            ns,
            child,
            _dir: dir,
            url: format!("http://{ip}:2379"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Command::new("ip")
            .args([
                "netns",
                "exec",
                &e.ns,
                "etcdctl",
                "--endpoints",
                &e.url,
                "endpoint",
                "health",
            ])
            .env("ETCDCTL_API", "3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        e
    }

    /// Runs `f` on a thread inside the namespace, on a runtime of its own.
    fn run<F: std::future::Future<Output = ()>>(&self, f: impl FnOnce(Arc<dyn Store>) -> F + Send) {
        let ns = self.ns.clone();
        let url = self.url.clone();
        std::thread::scope(|s| {
            s.spawn(move || {
                let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let store = EtcdStore::connect(&[url], Duration::from_secs(5))
                        .await
                        .unwrap();
                    f(Arc::new(store)).await
                });
            })
            .join()
            .unwrap();
        });
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

fn sqlite<F: std::future::Future<Output = ()>>(f: impl FnOnce(Arc<dyn Store>) -> F) {
    let d = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(d.path().join("s.db")).unwrap());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f(store));
}

/// Each check, on both backends. The etcd is shared by the checks of one test (each uses
/// its own key prefix).
macro_rules! both {
    ($name:ident, $check:ident) => {
        #[test]
        fn $name() {
            sqlite(|s| $check(s, "sqlite/".to_string()));
            let e = Etcd::start(stringify!($name));
            e.run(|s| $check(s, "etcd/".to_string()));
        }
    };
}

both!(revisions_and_versions, revisions);
both!(compare_and_swap, cas);
both!(prefix_ranges, ranges);
both!(watch_from_a_revision_misses_nothing, watch_history);
both!(watch_under_concurrent_writes, watch_concurrent);
both!(leases_delete_their_keys, leases);
both!(election_has_one_winner, election);
both!(a_snapshot_is_every_key_at_one_revision, snapshot);

/// The watch's next event, which must come within `wait`.
async fn next_event(w: &mut Watch, wait: Duration) -> Event {
    tokio::time::timeout(wait, w.next())
        .await
        .expect("events stopped")
        .expect("the watch ended")
        .unwrap()
}

async fn revisions(s: Arc<dyn Store>, p: String) {
    let r0 = s.revision().await.unwrap();
    let r1 = s.put(&format!("{p}a"), b"1".to_vec()).await.unwrap();
    assert_eq!(r1, r0 + 1, "a write is one revision");
    let r2 = s.put(&format!("{p}a"), b"2".to_vec()).await.unwrap();
    assert_eq!(r2, r1 + 1);
    let kv = s.get(&format!("{p}a")).await.unwrap().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r1, r2, 2)
    );
    assert_eq!(kv.value, b"2");
    // A transaction whose comparison fails and that has no failure ops changes nothing.
    let t = s
        .txn(Txn {
            compare: vec![Compare::ModRevision {
                key: format!("{p}a"),
                revision: 1,
            }],
            success: vec![Op::put(format!("{p}b"), "x")],
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(!t.succeeded);
    assert_eq!(s.revision().await.unwrap(), r2);
    assert!(s.get(&format!("{p}b")).await.unwrap().is_none());
    // Several ops in one transaction share one revision.
    let t = s
        .txn(Txn {
            success: vec![
                Op::put(format!("{p}c"), "1"),
                Op::put(format!("{p}d"), "1"),
                Op::delete(format!("{p}a")),
            ],
            ..Txn::default()
        })
        .await
        .unwrap();
    assert_eq!(t.revision, r2 + 1);
    assert_eq!(
        s.get(&format!("{p}c")).await.unwrap().unwrap().mod_revision,
        t.revision
    );
    // Re-created: a new create revision, version 1.
    let r = s.put(&format!("{p}a"), b"3".to_vec()).await.unwrap();
    let kv = s.get(&format!("{p}a")).await.unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.version), (r, 1));
}

async fn cas(s: Arc<dyn Store>, p: String) {
    let k = format!("{p}k");
    assert!(s.create(&k, b"v1".to_vec()).await.unwrap());
    assert!(
        !s.create(&k, b"v2".to_vec()).await.unwrap(),
        "create only once"
    );
    let kv = s.get(&k).await.unwrap().unwrap();
    let swap = |rev| Txn {
        compare: vec![Compare::ModRevision {
            key: k.clone(),
            revision: rev,
        }],
        success: vec![Op::put(&k, "v3")],
        failure: vec![Op::put(format!("{p}lost"), "1")],
    };
    assert!(s.txn(swap(kv.mod_revision)).await.unwrap().succeeded);
    assert!(
        !s.txn(swap(kv.mod_revision)).await.unwrap().succeeded,
        "a stale revision loses"
    );
    assert!(
        s.get(&format!("{p}lost")).await.unwrap().is_some(),
        "the failure branch ran"
    );
    let by_value = |v: &str| Txn {
        compare: vec![Compare::Value {
            key: k.clone(),
            value: v.as_bytes().to_vec(),
        }],
        success: vec![Op::delete(&k)],
        failure: vec![],
    };
    assert!(!s.txn(by_value("v1")).await.unwrap().succeeded);
    assert!(s.txn(by_value("v3")).await.unwrap().succeeded);
    assert!(
        !s.txn(by_value("v3")).await.unwrap().succeeded,
        "an absent key holds no value"
    );
    // Many racing creators: exactly one wins.
    let mut hs = Vec::new();
    for i in 0..20 {
        let (s, key) = (s.clone(), format!("{p}race"));
        hs.push(tokio::spawn(async move {
            s.create(&key, vec![i]).await.unwrap()
        }));
    }
    let mut wins = 0;
    for h in hs {
        wins += h.await.unwrap() as u32;
    }
    assert_eq!(wins, 1);
}

async fn snapshot(s: Arc<dyn Store>, p: String) {
    for k in ["b", "a", "c"] {
        s.put(&format!("{p}snap/{k}"), k.as_bytes().to_vec())
            .await
            .unwrap();
    }
    let snap = s.snapshot().await.unwrap();
    assert_eq!(snap.revision, s.revision().await.unwrap());
    let mine: Vec<_> = snap
        .kvs
        .iter()
        .filter(|kv| kv.key.starts_with(&format!("{p}snap/")))
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    let expected: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|k| (format!("{p}snap/{k}"), k.as_bytes().to_vec()))
        .collect();
    assert_eq!(mine, expected, "every key, in key order");
    assert!(snap.kvs.windows(2).all(|w| w[0].key < w[1].key));
    assert!(snap.kvs.iter().all(|kv| kv.mod_revision <= snap.revision));
}

async fn ranges(s: Arc<dyn Store>, p: String) {
    for k in ["n/b", "n/a", "n/c/d", "m/x", "n0"] {
        s.put(&format!("{p}{k}"), b"1".to_vec()).await.unwrap();
    }
    let keys: Vec<String> = s
        .range(&format!("{p}n/"))
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        keys,
        [format!("{p}n/a"), format!("{p}n/b"), format!("{p}n/c/d")]
    );
    s.txn(Txn {
        success: vec![Op::DeletePrefix {
            prefix: format!("{p}n/"),
        }],
        ..Txn::default()
    })
    .await
    .unwrap();
    assert!(s.range(&format!("{p}n/")).await.unwrap().is_empty());
    assert!(
        s.get(&format!("{p}n0")).await.unwrap().is_some(),
        "only the prefix"
    );
}

async fn watch_history(s: Arc<dyn Store>, p: String) {
    let from = s.put(&format!("{p}w/a"), b"1".to_vec()).await.unwrap();
    s.put(&format!("{p}x/ignored"), b"1".to_vec())
        .await
        .unwrap();
    let rb = s.put(&format!("{p}w/b"), b"2".to_vec()).await.unwrap();
    let mut w = s.watch(&format!("{p}w/"), from).await.unwrap();
    let rd = s.delete(&format!("{p}w/a")).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let ev = next_event(&mut w, Duration::from_secs(5)).await;
        seen.push((ev.kind, ev.kv.key.clone(), ev.kv.mod_revision));
    }
    assert_eq!(
        seen,
        [
            (EventKind::Put, format!("{p}w/a"), from),
            (EventKind::Put, format!("{p}w/b"), rb),
            (EventKind::Delete, format!("{p}w/a"), rd),
        ]
    );
    // From 0: only what happens next.
    let mut w = s.watch(&format!("{p}w/"), 0).await.unwrap();
    let r = s.put(&format!("{p}w/c"), b"3".to_vec()).await.unwrap();
    let ev = next_event(&mut w, Duration::from_secs(5)).await;
    assert_eq!(
        (ev.kv.key, ev.kv.mod_revision, ev.kv.value),
        (format!("{p}w/c"), r, b"3".to_vec())
    );
}

async fn watch_concurrent(s: Arc<dyn Store>, p: String) {
    let start = s.revision().await.unwrap() + 1;
    let writer = {
        let (s, p) = (s.clone(), p.clone());
        tokio::spawn(async move {
            for i in 0..300u32 {
                s.put(&format!("{p}c/{}", i % 7), i.to_be_bytes().to_vec())
                    .await
                    .unwrap();
            }
        })
    };
    // Start watching while the writes go on, from the revision before the first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut w = s.watch(&format!("{p}c/"), start).await.unwrap();
    let mut values = Vec::new();
    let mut last = 0;
    while values.len() < 300 {
        let ev = next_event(&mut w, Duration::from_secs(10)).await;
        assert!(ev.kv.mod_revision > last, "in revision order");
        last = ev.kv.mod_revision;
        values.push(u32::from_be_bytes(ev.kv.value[..4].try_into().unwrap()));
    }
    writer.await.unwrap();
    assert_eq!(
        values,
        (0..300).collect::<Vec<_>>(),
        "every write, once, in order"
    );
}

/// Puts `key` = "1" bound to `lease`.
async fn put_leased(s: &dyn Store, key: &str, lease: LeaseId) {
    s.txn(Txn {
        success: vec![Op::put_leased(key, b"1".to_vec(), lease)],
        ..Txn::default()
    })
    .await
    .unwrap();
}

async fn leases(s: Arc<dyn Store>, p: String) {
    let l = s.lease_grant(Duration::from_secs(2)).await.unwrap();
    put_leased(&*s, &format!("{p}l/eph"), l).await;
    s.put(&format!("{p}l/keep"), b"1".to_vec()).await.unwrap();
    assert_eq!(
        s.get(&format!("{p}l/eph")).await.unwrap().unwrap().lease,
        Some(l)
    );
    // Kept alive past its TTL: the key stays.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        s.lease_keep_alive(l).await.unwrap();
    }
    assert!(s.get(&format!("{p}l/eph")).await.unwrap().is_some());
    // Left alone: it expires and takes its key (and only its key) with it, with an event.
    let mut w = s.watch(&format!("{p}l/"), 0).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.get(&format!("{p}l/eph")).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ev = next_event(&mut w, Duration::from_secs(5)).await;
    assert_eq!(
        (ev.kind, ev.kv.key),
        (EventKind::Delete, format!("{p}l/eph"))
    );
    assert!(s.get(&format!("{p}l/keep")).await.unwrap().is_some());
    assert!(matches!(
        s.lease_keep_alive(l).await,
        Err(StoreError::LeaseNotFound(_))
    ));
    // Revoked: at once.
    let l2 = s.lease_grant(Duration::from_secs(60)).await.unwrap();
    put_leased(&*s, &format!("{p}l/r"), l2).await;
    s.lease_revoke(l2).await.unwrap();
    assert!(s.get(&format!("{p}l/r")).await.unwrap().is_none());
}

async fn election(s: Arc<dyn Store>, p: String) {
    let name = format!("{}test", p.trim_end_matches('/'));
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(s.lease_grant(Duration::from_secs(30)).await.unwrap());
    }
    // Three candidates at once: exactly one leads.
    let (tx, mut rx) = tokio::sync::mpsc::channel(3);
    let mut tasks = Vec::new();
    for (i, l) in leases.iter().enumerate() {
        let (s, tx, name, l) = (s.clone(), tx.clone(), name.clone(), *l);
        tasks.push(tokio::spawn(async move {
            let leader = Election::new(s, &name)
                .campaign(l, format!("host{i}").into_bytes())
                .await
                .unwrap();
            tx.send((i, leader)).await.unwrap();
        }));
    }
    let (first, leader) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rx.try_recv().is_err(),
        "a second leader while the first holds"
    );
    let e = Election::new(s.clone(), &name);
    let (_, who, _) = e.leader().await.unwrap().unwrap();
    assert_eq!(who, format!("host{first}").into_bytes());
    // The fence: a write guarded by the leader's revision succeeds while it leads.
    let guarded = |l: &paddock_store::election::Leader| Txn {
        compare: vec![l.fence()],
        success: vec![Op::put(format!("{p}fenced"), "1")],
        failure: vec![],
    };
    assert!(s.txn(guarded(&leader)).await.unwrap().succeeded);
    // The leader's lease goes (a crash): the next candidate takes over, and the old
    // leader's fenced writes fail.
    s.lease_revoke(leader.lease).await.unwrap();
    let (second, next) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(second, first);
    assert!(next.revision > leader.revision);
    assert!(
        !s.txn(guarded(&leader)).await.unwrap().succeeded,
        "a deposed leader is fenced off"
    );
    assert!(s.txn(guarded(&next)).await.unwrap().succeeded);
    // Resigning hands over to the last one.
    e.resign(&next).await.unwrap();
    let (third, _) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(third != first && third != second);
    for t in tasks {
        t.await.unwrap();
    }
}
