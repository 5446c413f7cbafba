//! The etcd v3 backend, for an appliance of several hosts: every call is one etcd request,
//! so revisions, transactions, watches and leases have etcd's own semantics (which the
//! [`crate::Store`] contract was modelled on). The conformance suite in `tests/` runs the
//! same checks against this backend and the SQLite one.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare as ECompare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    PutOptions, Txn as ETxn, TxnOp, WatchOptions,
};
use tokio::sync::mpsc;

use crate::{
    Compare, Event, EventKind, KeyValue, LeaseId, Op, Revision, Snapshot, Store, StoreError, Txn,
    TxnResponse, Watch,
};

/// A store on an etcd cluster. Cloning shares the connection.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    timeout: Duration,
}

fn err(e: etcd_client::Error) -> StoreError {
    StoreError::Etcd(e.to_string())
}

fn convert(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: (kv.lease() != 0).then_some(kv.lease()),
    }
}

/// TLS to the etcd members: their CA, and this host's client certificate and key (PEM).
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster (any of `endpoints`, e.g. `http://198.18.0.1:2379`). Requests
    /// time out after `timeout`, so a partitioned member fails calls instead of hanging.
    pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with(endpoints, timeout, None).await
    }

    /// Like [`connect`](Self::connect), over TLS when `tls` is given: the members are checked
    /// against its CA and this host authenticates with its certificate (`https://` endpoints).
    pub async fn connect_with(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<&EtcdTls>,
    ) -> Result<Self, StoreError> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout);
        if let Some(t) = tls {
            opts = opts.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(&t.ca_pem))
                    .identity(etcd_client::Identity::from_pem(&t.cert_pem, &t.key_pem)),
            );
        }
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| StoreError::Etcd(format!("connecting to etcd at {endpoints:?}: {e}")))?;
        Ok(EtcdStore { client, timeout })
    }

    /// Every request ends by the timeout, whatever state the connection is in (tonic's own
    /// timeout does not cover a channel that is still connecting).
    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(err),
            Err(_) => Err(StoreError::Etcd(format!(
                "no answer from etcd within {:?}",
                self.timeout
            ))),
        }
    }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    // The first key after every key that starts with `prefix` (etcd's range_end).
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn ops(list: &[Op]) -> Vec<TxnOp> {
    list.iter()
        .map(|op| match op {
            Op::Put { key, value, lease } => TxnOp::put(
                key.as_bytes(),
                value.clone(),
                lease.map(|l| PutOptions::new().with_lease(l)),
            ),
            Op::Delete { key } => TxnOp::delete(key.as_bytes(), None),
            Op::DeletePrefix { prefix } => TxnOp::delete(
                prefix.as_bytes(),
                Some(DeleteOptions::new().with_range(prefix_end(prefix))),
            ),
        })
        .collect()
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut c = self.client.clone();
        let r = self.bounded(c.get(key, None)).await?;
        Ok(r.kvs().first().map(convert))
    }

    async fn range(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        let r = self
            .client
            .clone()
            .get(
                prefix,
                Some(GetOptions::new().with_range(prefix_end(prefix))),
            )
            .await
            .map_err(err)?;
        Ok(r.kvs().iter().map(convert).collect())
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, StoreError> {
        let compares: Vec<ECompare> = txn
            .compare
            .iter()
            .map(|c| match c {
                Compare::ModRevision { key, revision } => {
                    ECompare::mod_revision(key.as_bytes(), CompareOp::Equal, *revision)
                }
                Compare::Value { key, value } => {
                    ECompare::value(key.as_bytes(), CompareOp::Equal, value.clone())
                }
            })
            .collect();
        let t = ETxn::new()
            .when(compares)
            .and_then(ops(&txn.success))
            .or_else(ops(&txn.failure));
        let mut c = self.client.clone();
        let r = self.bounded(c.txn(t)).await.map_err(|e| {
            let text = e.to_string();
            if text.contains("requested lease not found") {
                // Which lease is not in the answer; say what we can.
                StoreError::Etcd(format!("a lease in the transaction does not exist: {text}"))
            } else {
                e
            }
        })?;
        Ok(TxnResponse {
            succeeded: r.succeeded(),
            revision: r.header().map_or(0, |h| h.revision()),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        let mut opts = WatchOptions::new().with_range(prefix_end(prefix));
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let mut c = self.client.clone();
        let mut stream = self.bounded(c.watch(prefix, Some(opts))).await?;
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            loop {
                // A watch nobody reads any more ends now, not at its key's next change.
                let next = tokio::select! {
                    () = tx.closed() => return,
                    next = stream.message() => next,
                };
                let msg = match next {
                    Ok(Some(m)) => m,
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(err(e))).await;
                        return;
                    }
                };
                if msg.compact_revision() > 0 {
                    let _ = tx
                        .send(Err(StoreError::Compacted {
                            requested: from,
                            oldest: msg.compact_revision(),
                        }))
                        .await;
                    return;
                }
                if msg.canceled() {
                    let _ = tx
                        .send(Err(StoreError::Etcd(format!(
                            "etcd cancelled the watch: {}",
                            msg.cancel_reason()
                        ))))
                        .await;
                    return;
                }
                for e in msg.events() {
                    let Some(kv) = e.kv() else { continue };
                    let kind = match e.event_type() {
                        EventType::Put => EventKind::Put,
                        EventType::Delete => EventKind::Delete,
                    };
                    let mut kv = convert(kv);
                    if kind == EventKind::Delete {
                        kv.value.clear();
                    }
                    if tx.send(Ok(Event { kind, kv })).await.is_err() {
                        return; // the watcher was dropped; dropping the stream cancels it
                    }
                }
            }
        });
        Ok(Watch::from_receiver(rx))
    }

    async fn revision(&self) -> Result<Revision, StoreError> {
        // A get of a key that never exists answers with the current revision.
        let mut c = self.client.clone();
        let r = self.bounded(c.get("\0paddock-revision", None)).await?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        // One range read answers at one revision, which its header names. etcd wants a key:
        // from "\0" to the end ("\0" as range_end: every key at or after it).
        let mut c = self.client.clone();
        let r = self
            .bounded(c.get("\0", Some(GetOptions::new().with_range(prefix_end("")))))
            .await?;
        Ok(Snapshot {
            revision: r.header().map_or(0, |h| h.revision()),
            kvs: r.kvs().iter().map(convert).collect(),
        })
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let secs =
            i64::try_from(ttl.as_secs().max(1)).map_err(|_| StoreError::LeaseTooLong(ttl))?;
        let mut c = self.client.clone();
        let r = self.bounded(c.lease_grant(secs, None)).await?;
        Ok(r.id())
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        let lease_err = |e: etcd_client::Error| {
            if e.to_string().contains("not found") {
                StoreError::LeaseNotFound(lease)
            } else {
                err(e)
            }
        };
        let mut c = self.client.clone();
        let res = tokio::time::timeout(self.timeout, async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.map_err(lease_err)?;
            keeper.keep_alive().await.map_err(lease_err)?;
            match stream.message().await.map_err(lease_err)? {
                Some(r) if r.ttl() > 0 => Ok(()),
                _ => Err(StoreError::LeaseNotFound(lease)),
            }
        })
        .await;
        res.unwrap_or_else(|_| {
            Err(StoreError::Etcd(format!(
                "no keep-alive answer from etcd within {:?}",
                self.timeout
            )))
        })
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        let mut c = self.client.clone();
        match self.bounded(c.lease_revoke(lease)).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("not found") => Err(StoreError::LeaseNotFound(lease)),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefix_ends() {
        assert_eq!(super::prefix_end("nodes/"), b"nodes0".to_vec());
        assert_eq!(super::prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(super::prefix_end(""), vec![0]);
    }
}
