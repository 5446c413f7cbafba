//! The console's in-memory view of the nodes, fed by a watch on `nodes/` (as the design asks
//! of every process: an in-memory view fed by watches). The machines list and the dashboard
//! read it instead of reading and parsing every node record on each request, so a page of 50
//! out of 10,000 machines costs the sort and filter of references, not 10,000 JSON parses.
//!
//! Loading: the current revision is read, then the prefix, then a watch from the next
//! revision; events the range already reflected are skipped by each key's revision. A lagged
//! or failed watch loads again. Every `/ui/events` node event waits (briefly) until the view
//! has applied its revision, so a page that re-reads itself on the event sees the change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use paddock_inspector::node::Node;
use paddock_inspector::service::NODES;
use paddock_store::{EventKind, Revision, Store};
use tokio::sync::watch;

/// The nodes by key, each with the revision of its record.
pub struct NodeView {
    nodes: RwLock<HashMap<String, (Revision, Node)>>,
    /// The highest `nodes/` revision applied; 0 until the first load.
    applied: watch::Sender<Revision>,
}

impl NodeView {
    /// Reads the nodes under the lock (no await inside `f`).
    pub fn with<T>(&self, f: impl FnOnce(Vec<&Node>) -> T) -> T {
        let map = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        f(map.values().map(|(_, n)| n).collect())
    }

    /// Waits until the first load is done (false: it did not finish within `limit`).
    pub async fn ready(&self, limit: Duration) -> bool {
        self.wait_applied(1, limit).await
    }

    /// Waits until the view has applied `rev` (false: not within `limit`).
    pub async fn wait_applied(&self, rev: Revision, limit: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|r| *r >= rev))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn apply(&self, key: String, rev: Revision, node: Option<Node>) {
        let mut map = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        if map.get(&key).is_some_and(|(r, _)| *r >= rev) {
            return;
        }
        match node {
            Some(n) => {
                map.insert(key, (rev, n));
            }
            None => {
                map.remove(&key);
            }
        }
    }

    async fn follow(self: Arc<Self>, store: Arc<dyn Store>) {
        loop {
            if let Err(e) = self.load_and_watch(&store).await {
                tracing::warn!(error = %e, "console: the node view reloads");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }

    async fn load_and_watch(&self, store: &Arc<dyn Store>) -> anyhow::Result<()> {
        let rev = store.revision().await?;
        let mut w = store.watch(NODES, rev + 1).await?;
        let kvs = store.range(NODES).await?;
        let mut map = HashMap::with_capacity(kvs.len());
        for kv in kvs {
            if let Ok(n) = serde_json::from_slice::<Node>(&kv.value) {
                map.insert(kv.key, (kv.mod_revision, n));
            }
        }
        *self.nodes.write().unwrap_or_else(|p| p.into_inner()) = map;
        self.applied.send_replace(rev.max(1));
        loop {
            let ev = match w.next().await {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the store's watch ended"),
            };
            let rev = ev.kv.mod_revision;
            let node = match ev.kind {
                EventKind::Put => serde_json::from_slice::<Node>(&ev.kv.value).ok(),
                EventKind::Delete => None,
            };
            self.apply(ev.kv.key, rev, node);
            self.applied.send_if_modified(|r| {
                let newer = rev > *r;
                *r = (*r).max(rev);
                newer
            });
        }
    }
}

/// The view of `store`'s nodes, started on first use (one per store in the process).
pub fn view(store: &Arc<dyn Store>) -> Arc<NodeView> {
    type Views = Mutex<Vec<(usize, Arc<NodeView>)>>;
    static VIEWS: OnceLock<Views> = OnceLock::new();
    let id = Arc::as_ptr(store).cast::<()>() as usize;
    let mut views = VIEWS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((_, v)) = views.iter().find(|(k, _)| *k == id) {
        return v.clone();
    }
    let v = Arc::new(NodeView {
        nodes: RwLock::new(HashMap::new()),
        applied: watch::channel(0).0,
    });
    tokio::spawn(v.clone().follow(store.clone()));
    views.push((id, v.clone()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_view_follows_puts_and_deletes_and_skips_what_it_has() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let node = |i: u128, name: &str| {
            let mut n = Node::new(uuid::Uuid::from_u128(i), 1_700_000_000);
            n.name = Some(name.into());
            (
                format!("{NODES}{}", n.uuid),
                serde_json::to_vec(&n).unwrap(),
            )
        };
        let (k1, v1) = node(1, "a");
        store.put(&k1, v1).await.unwrap();
        let v = view(&store);
        assert!(v.ready(Duration::from_secs(5)).await);
        assert_eq!(v.with(|n| n.len()), 1);
        let (k2, v2) = node(2, "b");
        let rev = store.put(&k2, v2).await.unwrap();
        let (_, v1b) = node(1, "a2");
        store.put(&k1, v1b).await.unwrap();
        let rev = store.delete(&k2).await.unwrap().max(rev);
        assert!(v.wait_applied(rev, Duration::from_secs(5)).await);
        let names = v.with(|n| {
            n.iter()
                .map(|n| n.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        });
        assert_eq!(names, ["a2"]);
        // An older event for a key is skipped.
        v.apply(k1.clone(), 1, None);
        assert_eq!(v.with(|n| n.len()), 1);
    }
}
