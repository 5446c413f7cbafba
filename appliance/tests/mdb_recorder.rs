//! The MDB recorder reads only the nodes a change names: `/v1/continue` costs the same with
//! 10 nodes as with 10,000. Drives `Inspector::process` (what the `/v1/continue` handler
//! calls) over a store that counts what it is asked for; prints the figures at both sizes.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use paddock::images::MdbRecorder;
use paddock_imageserver::mdb::MdbService;
use paddock_inspector::node::{Introspection, Node};
use paddock_inspector::service::{Inspector, InspectorConfig, MACS, NODES, NodeObserver};
use paddock_inspector::state::State;
use paddock_store::{
    KeyValue, LeaseId, Op, Revision, SqliteStore, Store, StoreError, Txn, TxnResponse, Watch,
};

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A store that counts reads: calls, and node records returned (by `get` or `range`).
struct Counting {
    inner: SqliteStore,
    reads: AtomicUsize,
    node_records: AtomicUsize,
}

impl Counting {
    fn snapshot(&self) -> (usize, usize) {
        (
            self.reads.load(Ordering::SeqCst),
            self.node_records.load(Ordering::SeqCst),
        )
    }

    /// Counts one read that returned `kvs`.
    fn read<'a>(&self, kvs: impl Iterator<Item = &'a KeyValue>) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let nodes = kvs.filter(|kv| kv.key.starts_with(NODES)).count();
        self.node_records.fetch_add(nodes, Ordering::SeqCst);
    }
}

/// A read method of `Store` that counts what it returns.
macro_rules! counted_read {
    ($method:ident, $out:ty) => {
        fn $method<'s, 'k, 'f>(&'s self, key: &'k str) -> BoxFut<'f, $out>
        where
            's: 'f,
            'k: 'f,
            Self: 'f,
        {
            Box::pin(async move {
                let found = self.inner.$method(key).await?;
                self.read(found.iter());
                Ok(found)
            })
        }
    };
}

// `Store` is an `#[async_trait]` trait; these are the signatures it expands to.
impl Store for Counting {
    counted_read!(get, Option<KeyValue>);
    counted_read!(range, Vec<KeyValue>);

    fn txn<'s, 'f>(&'s self, txn: Txn) -> BoxFut<'f, TxnResponse>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.txn(txn)
    }

    fn watch<'s, 'k, 'f>(&'s self, prefix: &'k str, from: Revision) -> BoxFut<'f, Watch>
    where
        's: 'f,
        'k: 'f,
        Self: 'f,
    {
        self.inner.watch(prefix, from)
    }

    fn revision<'s, 'f>(&'s self) -> BoxFut<'f, Revision>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.revision()
    }

    fn snapshot<'s, 'f>(&'s self) -> BoxFut<'f, paddock_store::Snapshot>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.snapshot()
    }

    fn lease_grant<'s, 'f>(&'s self, ttl: Duration) -> BoxFut<'f, LeaseId>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.lease_grant(ttl)
    }

    fn lease_keep_alive<'s, 'f>(&'s self, lease: LeaseId) -> BoxFut<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.lease_keep_alive(lease)
    }

    fn lease_revoke<'s, 'f>(&'s self, lease: LeaseId) -> BoxFut<'f, ()>
    where
        's: 'f,
        Self: 'f,
    {
        self.inner.lease_revoke(lease)
    }
}

fn mac(i: usize, tag: u8) -> String {
    let b = u32::try_from(i)
        .expect("fewer than 2^32 machines")
        .to_be_bytes();
    format!("52:54:{tag:02x}:{:02x}:{:02x}:{:02x}", b[1], b[2], b[3])
}

/// `count` nodes that finished an introspection long ago (not in the MDB).
async fn seed(store: &SqliteStore, count: usize) {
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let mut n = Node::new(uuid::Uuid::new_v4(), 1_000);
            n.macs = vec![mac(i, 0xa0).parse().unwrap()];
            n.pxe_mac = n.macs.first().copied();
            n.introspection = Some(Introspection {
                state: State::Finished,
                started_at: Some(1_000),
                finished_at: Some(1_100),
                error: None,
                manage_boot: false,
                set_image: None,
            });
            n
        })
        .collect();
    for chunk in nodes.chunks(1_000) {
        let mut txn = Txn::default();
        for n in chunk {
            let id = n.uuid.to_string();
            txn.success.push(Op::put(
                format!("{NODES}{id}"),
                serde_json::to_vec(n).unwrap(),
            ));
            for m in &n.macs {
                txn.success.push(Op::put(format!("{MACS}{m}"), id.clone()));
            }
        }
        assert!(store.txn(txn).await.unwrap().succeeded);
    }
}

struct Figures {
    p50: Duration,
    max: Duration,
    reads: usize,
    node_records: usize,
    observer_node_records: usize,
}

const ROUNDS: usize = 20;

async fn measure(fleet: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(dir.path().join("store.db")).unwrap();
    seed(&inner, fleet).await;
    let store = Arc::new(Counting {
        inner,
        reads: AtomicUsize::new(0),
        node_records: AtomicUsize::new(0),
    });
    let inspector = Arc::new(Inspector::new(store.clone(), InspectorConfig::default()));
    let mdb = MdbService::new(store.clone(), None);
    inspector.observe(MdbRecorder::new(inspector.clone(), mdb.clone()));

    let mut times = Vec::new();
    let (mut reads, mut node_records) = (Vec::new(), Vec::new());
    let mut enrolled = Vec::new();
    for round in 0..ROUNDS {
        let body = support::inventory(&[&mac(round, 0xb0)], 2, 1024, &[10]).to_string();
        let before = store.snapshot();
        let started = Instant::now();
        let uuid = inspector.process(body.as_bytes(), 2_000).await.unwrap();
        times.push(started.elapsed());
        let after = store.snapshot();
        reads.push(after.0 - before.0);
        node_records.push(after.1 - before.1);
        enrolled.push(uuid);
    }
    // Every machine that enrolled is in the MDB, with the address its PXE NIC reported.
    let entries = mdb.entries().await.unwrap();
    for uuid in &enrolled {
        let e = &entries[&uuid.to_string()];
        assert_eq!(e.machine.ip_address, "198.18.0.150");
    }
    // The observer alone (a fresh recorder: nothing recorded yet), told about one node.
    let fresh = MdbRecorder::new(inspector.clone(), mdb.clone());
    let before = store.snapshot();
    fresh
        .nodes_changed(paddock_inspector::service::Changed::Nodes(&enrolled[..1]))
        .await;
    let observer_node_records = store.snapshot().1 - before.1;

    times.sort();
    Figures {
        p50: times[ROUNDS / 2],
        max: times[ROUNDS - 1],
        reads: *reads.iter().max().unwrap(),
        node_records: *node_records.iter().max().unwrap(),
        observer_node_records,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_reads_only_the_changed_node_at_any_fleet_size() {
    let small = measure(10).await;
    let large = measure(10_000).await;
    for (fleet, f) in [(10, &small), (10_000, &large)] {
        println!(
            "mdb recorder: {fleet:>6} nodes: /v1/continue p50 {:>7.2} ms, max {:>7.2} ms; \
             at most {} store reads and {} node records read per continue; the observer alone reads {} node record(s)",
            f.p50.as_secs_f64() * 1e3,
            f.max.as_secs_f64() * 1e3,
            f.reads,
            f.node_records,
            f.observer_node_records,
        );
    }
    // The work per change does not grow with the fleet: the same reads at both sizes, and
    // only the changed node's record.
    assert_eq!(small.reads, large.reads);
    assert_eq!(small.node_records, large.node_records);
    assert!(large.node_records <= 2, "{}", large.node_records);
    assert_eq!(small.observer_node_records, 1);
    assert_eq!(large.observer_node_records, 1);
}
