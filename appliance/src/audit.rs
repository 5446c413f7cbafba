//! The audit log: who changed what, and who was refused. Three kinds of entry, each kept by
//! a budget of its own so that one cannot push the others out:
//!
//! - operators' calls (certificates, tokens, insecure mode): `audit/op/<ms>-<random>`;
//! - agents' writes (inventories, provisioning reports, certificates issued): `audit/agent/…`;
//! - refused calls, counted per minute, source address, caller and method:
//!   `audit/refused/<minute ms>-<digest>`, one entry with a count however many calls there
//!   were, so that a flood of refusals writes a handful of keys.
//!
//! Entries written before the log had kinds (`audit/<ms>-<random>`) count as operators'.
//! Refusals are counted in memory and written every few seconds: a crash loses at most
//! that many seconds of counts, never an operator's entry (those are written before the
//! answer is sent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use paddock_store::{Store, Txn};
use serde::{Deserialize, Serialize};

pub const AUDIT: &str = "audit/";
const OPERATORS: &str = "audit/op/";
const AGENTS: &str = "audit/agent/";
const REFUSED: &str = "audit/refused/";

/// Entries kept of each kind (the leader prunes the oldest beyond this).
pub const KEEP: usize = 10_000;

/// One audited call, or (`count` > 1) the refusals of one minute.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AuditEntry {
    pub at_ms: i64,
    /// The certificate's CN, the token's name, `agent:<mac>`, or `-` (insecure mode).
    pub who: String,
    /// `certificate`, `token`, `agent`, `none` or `insecure`.
    pub proof: String,
    pub method: String,
    /// The HTTP method and path: what the call was on.
    pub target: String,
    pub status: u16,
    pub peer: String,
    /// Calls this entry stands for (refusals within one minute).
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

impl AuditEntry {
    /// An entry for a call that happened just now.
    pub fn now(
        who: &str,
        proof: &str,
        method: &str,
        http: &str,
        path: &str,
        status: u16,
        peer: &str,
    ) -> Self {
        AuditEntry {
            at_ms: paddock_wire::unix_ms(),
            who: who.into(),
            proof: proof.into(),
            method: method.into(),
            target: format!("{http} {path}"),
            status,
            peer: peer.into(),
            count: 1,
        }
    }
}

/// Which budget an entry is kept under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Operator,
    Agent,
    Refused,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Operator => OPERATORS,
            Kind::Agent => AGENTS,
            Kind::Refused => REFUSED,
        }
    }

    /// The kind a stored key belongs to (older keys without one: operators').
    pub fn of_key(key: &str) -> Kind {
        if key.starts_with(AGENTS) {
            Kind::Agent
        } else if key.starts_with(REFUSED) {
            Kind::Refused
        } else {
            Kind::Operator
        }
    }
}

/// What refusals are counted by: one entry per minute and source, caller and method.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RefusalKey {
    minute_ms: i64,
    source: String,
    who: String,
    method: String,
}

impl RefusalKey {
    /// `audit/refused/<minute>-<host>-<source, caller, method in hex>`: the same key for
    /// the whole minute on this host, so a flood rewrites one entry; `host` keeps two
    /// hosts' counts apart.
    fn store_key(&self, host: &str) -> String {
        let parts = format!("{}\0{}\0{}", self.source, self.who, self.method);
        format!(
            "{REFUSED}{:013}-{host}-{}",
            self.minute_ms,
            hex::encode(parts.as_bytes())
        )
    }
}

/// Refusals counted since the last write. Pure: entries in, what to write out.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Each minute's entry, and whether its count changed since the last
    /// [`Refusals::take`].
    counts: HashMap<RefusalKey, (AuditEntry, bool)>,
}

impl Refusals {
    /// Counts one refused call.
    pub fn add(&mut self, e: AuditEntry) {
        let minute_ms = e.at_ms - e.at_ms.rem_euclid(60_000);
        // The source address without its port: one host, whatever connections it opens.
        let source = e
            .peer
            .parse::<std::net::SocketAddr>()
            .map_or_else(|_| e.peer.clone(), |a| a.ip().to_string());
        let key = RefusalKey {
            minute_ms,
            source: source.clone(),
            who: e.who.clone(),
            method: e.method.clone(),
        };
        let (agg, dirty) = self.counts.entry(key).or_insert_with(|| {
            (
                AuditEntry {
                    at_ms: minute_ms,
                    peer: source,
                    count: 0,
                    ..e.clone()
                },
                false,
            )
        });
        agg.count += 1;
        agg.status = e.status;
        agg.target = e.target;
        *dirty = true;
    }

    /// The entries to write now (key and entry) for `host`; minutes before `now_ms`'s
    /// previous one are forgotten once written.
    pub fn take(&mut self, now_ms: i64, host: &str) -> Vec<(String, AuditEntry)> {
        let mut out = Vec::new();
        for (k, (e, dirty)) in &mut self.counts {
            if std::mem::take(dirty) {
                out.push((k.store_key(host), e.clone()));
            }
        }
        let current = now_ms - now_ms.rem_euclid(60_000);
        self.counts.retain(|k, _| k.minute_ms >= current - 60_000);
        out
    }
}

/// The keys to delete so that each kind keeps its newest `keep`. Pure.
pub fn prune_plan(mut keys: Vec<String>, keep: usize) -> Vec<String> {
    // Keys sort by time within a kind (the ms part is zero-padded after the prefix).
    keys.sort_by(|a, b| {
        let at = |k: &str| k.rsplit('/').next().unwrap_or("").to_string();
        at(a).cmp(&at(b))
    });
    let mut by_kind: HashMap<Kind, Vec<String>> = HashMap::new();
    for k in keys {
        by_kind.entry(Kind::of_key(&k)).or_default().push(k);
    }
    let mut out = Vec::new();
    for (_, keys) in by_kind {
        if keys.len() > keep {
            let old = keys.len() - keep;
            out.extend(keys.into_iter().take(old));
        }
    }
    out.sort();
    out
}

/// The audit log over the store.
pub struct Audit {
    store: Arc<dyn Store>,
    refusals: Mutex<Refusals>,
    /// This process, in refusal keys (random at start).
    host: String,
}

impl Audit {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Audit {
            store,
            refusals: Mutex::default(),
            host: hex::encode(paddock_security::token::random::<4>()),
        }
    }

    /// Records one call (errors are logged: the call has already happened).
    pub async fn record(&self, kind: Kind, entry: AuditEntry) {
        if kind == Kind::Refused {
            self.refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(entry);
            return;
        }
        let key = format!(
            "{}{:013}-{}",
            kind.prefix(),
            entry.at_ms,
            hex::encode(paddock_security::token::random::<4>())
        );
        self.put(&key, &entry).await;
    }

    async fn put(&self, key: &str, entry: &AuditEntry) {
        match serde_json::to_vec(entry) {
            Ok(v) => {
                if let Err(e) = self.store.put(key, v).await {
                    tracing::error!(error = %e, ?entry, "audit: could not record a call");
                }
            }
            Err(e) => tracing::error!(error = %e, "audit: could not encode"),
        }
    }

    /// Writes the refusals counted since the last call (every host, every few seconds).
    pub async fn flush(&self, now_ms: i64) {
        let batch = self
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now_ms, &self.host);
        for (key, entry) in batch {
            self.put(&key, &entry).await;
        }
    }

    /// The newest `limit` entries of every kind, newest first.
    pub async fn log(&self, limit: usize) -> anyhow::Result<Vec<AuditEntry>> {
        // This host's counts first, so a refusal just made is already there.
        self.flush(paddock_wire::unix_ms()).await;
        let mut entries: Vec<AuditEntry> = self
            .store
            .range(AUDIT)
            .await?
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
        entries.truncate(limit);
        Ok(entries)
    }

    /// Deletes all but the newest [`KEEP`] entries of each kind (the leader, now and then).
    pub async fn prune(&self) -> anyhow::Result<usize> {
        let keys = self
            .store
            .range(AUDIT)
            .await?
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        let old = prune_plan(keys, KEEP);
        for chunk in old.chunks(256) {
            let txn = Txn {
                success: chunk.iter().map(paddock_store::Op::delete).collect(),
                ..Txn::default()
            };
            self.store.txn(txn).await?;
        }
        Ok(old.len())
    }
}

/// On the leader, the log keeps the newest entries (pruned every minute); on every host,
/// refusals counted in memory are written every few seconds.
pub fn start(rt: &mut crate::runtime::Runtime, audit: Arc<Audit>) {
    let a = audit.clone();
    rt.every_while_leading(
        "audit: pruning",
        std::time::Duration::from_secs(60),
        move |_| {
            let a = a.clone();
            async move {
                match a.prune().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "audit: pruned"),
                    Err(e) => tracing::error!(error = %e, "audit: pruning failed"),
                }
            }
        },
    );
    rt.every(
        "audit: refusals",
        std::time::Duration::from_secs(5),
        move || {
            let a = audit.clone();
            async move { a.flush(paddock_wire::unix_ms()).await }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(at_ms: i64, peer: &str, who: &str) -> AuditEntry {
        AuditEntry {
            at_ms,
            who: who.into(),
            proof: "none".into(),
            method: "Nodes.Create".into(),
            target: "POST /api/v1/nodes".into(),
            status: 401,
            peer: peer.into(),
            count: 1,
        }
    }

    #[test]
    fn a_thousand_refusals_in_a_minute_are_one_entry_per_source_and_caller() {
        let mut r = Refusals::default();
        for i in 0..1000 {
            r.add(refused(
                60_000 + i,
                &format!("198.18.0.9:{}", 40_000 + i),
                "x",
            ));
        }
        r.add(refused(60_500, "198.18.0.10:1", "x"));
        let out = r.take(61_000, "h");
        assert_eq!(out.len(), 2, "{out:?}");
        let nine = out.iter().find(|(_, e)| e.peer == "198.18.0.9").unwrap();
        assert_eq!(nine.1.count, 1000);
        assert_eq!(nine.1.at_ms, 60_000);
        // Nothing new: nothing to write; a later refusal rewrites its minute's entry.
        assert!(r.take(61_000, "h").is_empty());
        r.add(refused(61_500, "198.18.0.9:1", "x"));
        let again = r.take(62_000, "h");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].0, nine.0, "the same key, its count grown");
        assert_eq!(again[0].1.count, 1001);
        // Minutes long gone are forgotten.
        r.take(10 * 60_000, "h");
        assert!(r.counts.is_empty());
    }

    #[test]
    fn each_kind_keeps_its_own_budget() {
        let mut keys = Vec::new();
        for i in 0..5 {
            keys.push(format!("{OPERATORS}{i:013}-aa"));
        }
        for i in 0..50 {
            keys.push(format!("{REFUSED}{:013}-bb", 100 + i));
        }
        keys.push(format!("{AUDIT}{:013}-cc", 0));
        let gone = prune_plan(keys, 10);
        assert_eq!(gone.len(), 40, "only refusals beyond their budget");
        assert!(gone.iter().all(|k| k.starts_with(REFUSED)), "{gone:?}");
        assert!(gone.contains(&format!("{REFUSED}{:013}-bb", 100)));
        assert!(!gone.contains(&format!("{REFUSED}{:013}-bb", 149)));
    }
}
