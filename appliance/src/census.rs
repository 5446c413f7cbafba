//! The census of role instances: who is alive, as registrations bound to store
//! leases. An instance (or the agent of a host) registers once and keeps its lease alive;
//! when it dies, its lease expires and its keys go with it, so a dead host drops out of the
//! census by itself within the TTL.
//!
//! Store keys (every value bound to the registrant's lease):
//! - `census/hosts/<host>`: `{host, since_ms}`: the host is alive and may be given roles
//!   (its traits and properties are those of the enrolled node of the same name);
//! - `census/instances/<role>/<instance>`: `{role, instance, host, status?, since_ms}`; an
//!   instance whose status is anything but `up` leaves its service's DNS records (it keeps
//!   its own name); one that says nothing is up.
//!
//! Routes: `GET /api/v1/census`, `POST /api/v1/census/register {role?, instance?, host?,
//! status?, ttl_secs?}` → `{lease, ttl_secs, key}` (registering again replaces the entry,
//! so a status change is a new registration), `POST /api/v1/census/keepalive {lease}`,
//! `POST /api/v1/census/revoke {lease}`, `POST /api/v1/census/status {lease, status?}` (the
//! instance held by that lease says how it is; no status is up).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_inspector::service::Inspector;
use paddock_roles::{Census, Host, Instance, check_name, check_word};
use paddock_store::{Compare, LeaseId, Op, Store, StoreError, Txn};
use paddock_wire::{ApiError, unix_ms};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const HOSTS: &str = "census/hosts/";
pub const INSTANCES: &str = "census/instances/";
/// `census/leases/<lease>`: the registration a lease holds, bound to the same lease, so that
/// a keep-alive finds it without reading every registration.
pub const LEASES: &str = "census/leases/";
/// Default and bounds of a registration's TTL, in seconds.
pub const DEFAULT_TTL_SECS: u64 = 10;
const MAX_TTL_SECS: u64 = 3_600;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEntry {
    pub host: String,
    pub since_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceEntry {
    pub role: String,
    pub instance: String,
    #[serde(default)]
    pub host: Option<String>,
    /// What the instance says of itself; `None` is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Numbers it reports of its load (a role's `scale` follows one of them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, paddock_roles::Metric>,
    pub since_ms: i64,
}

/// Metrics one instance may report.
pub const MAX_METRICS: usize = 32;

/// Checks an instance's metrics: names as hook words, finite values, at most
/// [`MAX_METRICS`].
pub fn check_metrics(
    m: &BTreeMap<String, f64>,
) -> Result<BTreeMap<String, paddock_roles::Metric>, RegisterError> {
    if m.len() > MAX_METRICS {
        return Err(RegisterError::Metrics(format!(
            "{} metrics; at most {MAX_METRICS}",
            m.len()
        )));
    }
    m.iter()
        .map(|(k, v)| {
            check_word("metric", k)?;
            if !v.is_finite() {
                return Err(RegisterError::Metrics(format!(
                    "{k} = {v} is not a finite number"
                )));
            }
            Ok((k.clone(), paddock_roles::Metric(*v)))
        })
        .collect()
}

impl InstanceEntry {
    /// In its service's DNS records, as far as its own word goes.
    pub fn says_up(&self) -> bool {
        self.status.as_deref().is_none_or(|s| s == "up")
    }
}

/// `GET /api/v1/census`: the live registrations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CensusView {
    pub hosts: Vec<HostEntry>,
    pub instances: Vec<InstanceEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub instance: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    /// An instance's own word on its health: `up`, or anything else for not up.
    #[serde(default)]
    pub status: Option<String>,
    /// An instance's numbers (`rps`, …).
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub lease: LeaseId,
    pub ttl_secs: u64,
    pub key: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub lease: LeaseId,
}

/// `POST /api/v1/census/status`: what the instance registered under `lease` says of itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    pub lease: LeaseId,
    #[serde(default)]
    pub status: Option<String>,
    /// Its metrics now (absent: unchanged).
    #[serde(default)]
    pub metrics: Option<BTreeMap<String, f64>>,
}

impl Register {
    /// The key and value this registration puts, or why it is refused.
    pub fn entry(&self, now_ms: i64) -> Result<(String, Vec<u8>), RegisterError> {
        if let Some(h) = &self.host {
            check_word("host", h)?;
        }
        let value = match (&self.role, &self.instance) {
            (Some(role), Some(instance)) => {
                check_name(role)?;
                check_word("instance", instance)?;
                if let Some(s) = &self.status {
                    check_word("status", s)?;
                }
                let e = InstanceEntry {
                    role: role.clone(),
                    instance: instance.clone(),
                    host: self.host.clone(),
                    status: self.status.clone(),
                    metrics: check_metrics(&self.metrics)?,
                    since_ms: now_ms,
                };
                (format!("{INSTANCES}{role}/{instance}"), json(&e))
            }
            (None, None) if self.status.is_some() || !self.metrics.is_empty() => {
                return Err(RegisterError::HostStatus);
            }
            (None, None) => {
                let Some(host) = &self.host else {
                    return Err(RegisterError::Nothing);
                };
                let e = HostEntry {
                    host: host.clone(),
                    since_ms: now_ms,
                };
                (format!("{HOSTS}{host}"), json(&e))
            }
            _ => return Err(RegisterError::HalfAnInstance),
        };
        Ok(value)
    }

    pub fn ttl(&self) -> Result<u64, RegisterError> {
        let ttl = self.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
        if (1..=MAX_TTL_SECS).contains(&ttl) {
            Ok(ttl)
        } else {
            Err(RegisterError::Ttl(ttl))
        }
    }
}

/// Why a registration is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Name(#[from] paddock_roles::NameError),
    #[error("register a role instance (role and instance) or a host")]
    Nothing,
    #[error("a role instance needs both role and instance")]
    HalfAnInstance,
    #[error("a status or metrics belong to a role instance, not to a host")]
    HostStatus,
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("ttl_secs {0} must be 1 to {MAX_TTL_SECS}")]
    Ttl(u64),
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn store_error(e: StoreError) -> ApiError {
    ApiError::internal(e.to_string())
}

/// The census's store and the node records its hosts are described by.
#[derive(Clone)]
pub struct CensusService {
    pub store: Arc<dyn Store>,
    pub inspector: Arc<Inspector>,
}

impl CensusService {
    pub async fn register(&self, r: &Register) -> Result<Registered, ApiError> {
        let ttl = r.ttl().map_err(|e| ApiError::bad_request(e.to_string()))?;
        let (key, value) = r
            .entry(unix_ms())
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let lease = self
            .store
            .lease_grant(Duration::from_secs(ttl))
            .await
            .map_err(store_error)?;
        // Created only where no live registration holds the key, bound to the new lease.
        let absent = Compare::ModRevision {
            key: key.clone(),
            revision: 0,
        };
        let bound = Op::Put {
            key: key.clone(),
            value,
            lease: Some(lease),
        };
        let index = Op::put_leased(format!("{LEASES}{lease}"), key.clone().into_bytes(), lease);
        let txn = Txn {
            compare: vec![absent],
            success: vec![bound, index],
            failure: vec![],
        };
        let done = self.store.txn(txn).await.map_err(store_error)?;
        if !done.succeeded {
            let _ = self.store.lease_revoke(lease).await;
            return Err(ApiError::new(
                409,
                format!("{key} is already registered (by a live lease)"),
            ));
        }
        Ok(Registered {
            lease,
            ttl_secs: ttl,
            key,
        })
    }

    /// Whether a registration of the census is bound to `lease`. The store's other leases
    /// (the leader's election among them) are not the census's to keep alive or revoke.
    async fn holds(&self, lease: LeaseId) -> Result<bool, ApiError> {
        let index = format!("{LEASES}{lease}");
        if self.store.get(&index).await.map_err(store_error)?.is_some() {
            return Ok(true);
        }
        // A registration made before the index was kept: found by reading them all, and
        // indexed now, so that its next keep-alive is a single read.
        for prefix in [HOSTS, INSTANCES] {
            let kvs = self.store.range(prefix).await.map_err(store_error)?;
            if let Some(kv) = kvs.into_iter().find(|kv| kv.lease == Some(lease)) {
                let txn = Txn {
                    success: vec![Op::put_leased(index, kv.key.into_bytes(), lease)],
                    ..Txn::default()
                };
                self.store.txn(txn).await.map_err(store_error)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub async fn view(&self) -> Result<CensusView, StoreError> {
        let mut v = CensusView::default();
        for kv in self.store.range(HOSTS).await? {
            if let Ok(e) = serde_json::from_slice(&kv.value) {
                v.hosts.push(e);
            }
        }
        for kv in self.store.range(INSTANCES).await? {
            if let Ok(e) = serde_json::from_slice(&kv.value) {
                v.instances.push(e);
            }
        }
        Ok(v)
    }

    /// The planner's census: live hosts, described by their nodes (traits, properties),
    /// and live instances; with each host's node, for its timeline.
    /// `also_hosts`: more host names that count as live hosts when they are enrolled nodes
    /// (the roles loop passes the installed machines whose subd the dominator reaches).
    pub async fn census(
        &self,
        also_hosts: &std::collections::BTreeSet<String>,
    ) -> anyhow::Result<(Census, BTreeMap<String, Uuid>)> {
        let view = self.view().await?;
        let nodes = self.inspector.list().await?;
        let mut by_name = BTreeMap::new();
        for n in &nodes {
            by_name.insert(node_hostname(n), n);
        }
        let mut names: Vec<String> = view.hosts.iter().map(|h| h.host.clone()).collect();
        for h in also_hosts {
            if by_name.contains_key(h) && !names.contains(h) {
                names.push(h.clone());
            }
        }
        let hosts = names
            .iter()
            .map(|name| {
                let mut host = Host {
                    name: name.clone(),
                    ..Host::default()
                };
                if let Some(n) = by_name.get(name) {
                    host.traits = n.traits.iter().cloned().collect();
                    host.properties = n
                        .properties
                        .iter()
                        .filter_map(|(k, v)| match v {
                            serde_json::Value::String(s) => Some((k.clone(), s.clone())),
                            serde_json::Value::Number(x) => Some((k.clone(), x.to_string())),
                            serde_json::Value::Bool(b) => Some((k.clone(), b.to_string())),
                            _ => None,
                        })
                        .collect();
                }
                host
            })
            .collect();
        let mut metrics: BTreeMap<String, BTreeMap<String, _>> = BTreeMap::new();
        let instances = view
            .instances
            .into_iter()
            .map(|i| {
                if !i.metrics.is_empty() {
                    metrics
                        .entry(i.role.clone())
                        .or_default()
                        .insert(i.instance.clone(), i.metrics);
                }
                Instance {
                    role: i.role,
                    id: i.instance,
                    host: i.host,
                }
            })
            .collect();
        let uuids = by_name.iter().map(|(k, n)| (k.clone(), n.uuid)).collect();
        Ok((
            Census {
                hosts,
                instances,
                metrics,
                ..Census::default()
            },
            uuids,
        ))
    }
}

/// The name a node goes by as a host: its name, else `node-<8 hex of its UUID>` (the
/// hostname provisioning gives an unnamed node).
pub fn node_hostname(n: &paddock_inspector::node::Node) -> String {
    n.name.clone().unwrap_or_else(|| {
        let u = n.uuid.simple().to_string();
        format!("node-{}", &u[..8])
    })
}

pub fn router(c: CensusService) -> Router {
    Router::new()
        .route("/api/v1/census", get(list))
        .route("/api/v1/census/register", post(register))
        .route("/api/v1/census/keepalive", post(keepalive))
        .route("/api/v1/census/revoke", post(revoke))
        .route("/api/v1/census/status", post(status))
        .with_state(c)
}

async fn list(State(c): State<CensusService>) -> Result<Json<CensusView>, ApiError> {
    Ok(Json(c.view().await.map_err(store_error)?))
}

async fn register(
    State(c): State<CensusService>,
    Json(r): Json<Register>,
) -> Result<Json<Registered>, ApiError> {
    Ok(Json(c.register(&r).await?))
}

async fn keepalive(
    State(c): State<CensusService>,
    Json(l): Json<LeaseRef>,
) -> Result<Json<LeaseRef>, ApiError> {
    let gone = || {
        ApiError::not_found(format!(
            "lease {} holds no registration (expired or revoked): register again",
            l.lease
        ))
    };
    if !c.holds(l.lease).await? {
        return Err(gone());
    }
    match c.store.lease_keep_alive(l.lease).await {
        Ok(()) => Ok(Json(l)),
        Err(StoreError::LeaseNotFound(_)) => Err(gone()),
        Err(e) => Err(store_error(e)),
    }
}

async fn revoke(
    State(c): State<CensusService>,
    Json(l): Json<LeaseRef>,
) -> Result<Json<LeaseRef>, ApiError> {
    // A lease that holds no registration has nothing of the census to revoke: done, as for
    // one already gone.
    if !c.holds(l.lease).await? {
        return Ok(Json(l));
    }
    match c.store.lease_revoke(l.lease).await {
        Ok(()) | Err(StoreError::LeaseNotFound(_)) => Ok(Json(l)),
        Err(e) => Err(store_error(e)),
    }
}

/// Sets the status of the instance registered under the report's lease, in place: same key,
/// same lease, changed only if nobody changed it in between.
async fn status(
    State(c): State<CensusService>,
    Json(r): Json<StatusReport>,
) -> Result<Json<InstanceEntry>, ApiError> {
    if let Some(s) = &r.status {
        check_word("status", s).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let metrics = match &r.metrics {
        Some(m) => Some(check_metrics(m).map_err(|e| ApiError::bad_request(e.to_string()))?),
        None => None,
    };
    let held = c
        .store
        .range(INSTANCES)
        .await
        .map_err(store_error)?
        .into_iter()
        .find(|kv| kv.lease == Some(r.lease));
    let Some(kv) = held else {
        return Err(ApiError::not_found(format!(
            "no role instance is registered under lease {}",
            r.lease
        )));
    };
    let mut entry: InstanceEntry = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("{}: {e}", kv.key)))?;
    entry.status = r.status;
    if let Some(m) = metrics {
        entry.metrics = m;
    }
    let txn = Txn {
        compare: vec![Compare::ModRevision {
            key: kv.key.clone(),
            revision: kv.mod_revision,
        }],
        success: vec![Op::Put {
            key: kv.key.clone(),
            value: json(&entry),
            lease: Some(r.lease),
        }],
        failure: vec![],
    };
    if !c.store.txn(txn).await.map_err(store_error)?.succeeded {
        return Err(ApiError::new(
            409,
            format!("{} changed meanwhile: report again", kv.key),
        ));
    }
    Ok(Json(entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keep-alive and revoke act on the census's own leases: another lease of the store (the
    /// leader's election holds one) is neither kept alive nor revoked through them.
    #[tokio::test]
    async fn only_the_census_leases_are_kept_alive_or_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(paddock_store::SqliteStore::open(dir.path().join("s.db")).unwrap());
        let c = CensusService {
            inspector: Arc::new(Inspector::new(store.clone(), Default::default())),
            store: store.clone(),
        };
        let other = store.lease_grant(Duration::from_secs(60)).await.unwrap();
        store
            .txn(Txn {
                success: vec![Op::put_leased("cluster/leader", b"h1".to_vec(), other)],
                ..Txn::default()
            })
            .await
            .unwrap();
        let err = keepalive(State(c.clone()), Json(LeaseRef { lease: other }))
            .await
            .unwrap_err();
        assert_eq!(err.status, 404, "{err:?}");
        let Json(done) = revoke(State(c.clone()), Json(LeaseRef { lease: other }))
            .await
            .unwrap();
        assert_eq!(done.lease, other);
        assert!(store.get("cluster/leader").await.unwrap().is_some());
        // A registration's own lease: kept alive, then revoked with its entry.
        let mine = c
            .register(&Register {
                role: Some("web".into()),
                instance: Some("web-1".into()),
                host: None,
                status: None,
                metrics: BTreeMap::new(),
                ttl_secs: None,
            })
            .await
            .unwrap();
        let lease = LeaseRef { lease: mine.lease };
        let index = format!("{LEASES}{}", mine.lease);
        assert_eq!(
            store.get(&index).await.unwrap().map(|kv| kv.value),
            Some(mine.key.clone().into_bytes()),
            "the registration is indexed by its lease"
        );
        // One registered before the index existed is found by reading, then indexed.
        store.delete(&index).await.unwrap();
        let Json(kept) = keepalive(State(c.clone()), Json(lease)).await.unwrap();
        assert_eq!(kept, lease);
        assert!(store.get(&index).await.unwrap().is_some(), "indexed again");
        let Json(kept) = keepalive(State(c.clone()), Json(lease)).await.unwrap();
        assert_eq!(kept, lease);
        let Json(revoked) = revoke(State(c.clone()), Json(lease)).await.unwrap();
        assert_eq!(revoked, lease);
        assert!(store.get(&mine.key).await.unwrap().is_none());
        assert!(
            store.get(&index).await.unwrap().is_none(),
            "gone with the lease"
        );
    }

    #[test]
    fn registrations_name_an_instance_or_a_host() {
        let r = |role: Option<&str>, instance: Option<&str>, host: Option<&str>| Register {
            role: role.map(str::to_string),
            instance: instance.map(str::to_string),
            host: host.map(str::to_string),
            status: None,
            metrics: BTreeMap::new(),
            ttl_secs: None,
        };
        let (k, v) = r(Some("db"), Some("db-1"), Some("h1")).entry(5).unwrap();
        assert_eq!(k, "census/instances/db/db-1");
        let e: InstanceEntry = serde_json::from_slice(&v).unwrap();
        assert_eq!(e.host.as_deref(), Some("h1"));
        assert_eq!(e.since_ms, 5);
        assert!(e.says_up(), "no status is up");
        for (status, up) in [
            ("up", true),
            ("down", false),
            ("Up", false),
            ("verifying", false),
        ] {
            let mut with = r(Some("db"), Some("db-1"), None);
            with.status = Some(status.into());
            let e: InstanceEntry = serde_json::from_slice(&with.entry(0).unwrap().1).unwrap();
            assert_eq!(e.says_up(), up, "{status}");
        }
        let mut host_status = r(None, None, Some("h1"));
        host_status.status = Some("down".into());
        assert_eq!(host_status.entry(0), Err(RegisterError::HostStatus));
        let mut hostile = r(Some("db"), Some("db-1"), None);
        hostile.status = Some("<script>".into());
        assert!(hostile.entry(0).is_err());
        // Metrics: an instance's, named as words, finite.
        let mut loaded = r(Some("web"), Some("web-1"), None);
        loaded.metrics = [("rps".to_string(), 120.5)].into();
        let (_, v) = loaded.entry(0).unwrap();
        let e: InstanceEntry = serde_json::from_slice(&v).unwrap();
        assert_eq!(e.metrics["rps"], paddock_roles::Metric(120.5));
        for (name, value) in [("rps", f64::INFINITY), ("rps", f64::NAN), ("r ps", 1.0)] {
            loaded.metrics = [(name.to_string(), value)].into();
            assert!(loaded.entry(0).is_err(), "{name} = {value}");
        }
        let mut host_metrics = r(None, None, Some("h1"));
        host_metrics.metrics = [("rps".to_string(), 1.0)].into();
        assert_eq!(host_metrics.entry(0), Err(RegisterError::HostStatus));
        assert_eq!(
            r(None, None, Some("h1")).entry(0).unwrap().0,
            "census/hosts/h1"
        );
        for bad in [
            r(Some("db"), None, None),
            r(None, None, None),
            r(Some("DB"), Some("x"), None),
            r(Some("db"), Some("-rf"), None),
            r(Some("db"), Some("a/b"), None),
            r(None, None, Some("h 1")),
        ] {
            assert!(bad.entry(0).is_err(), "{bad:?}");
        }
        assert_eq!(r(None, None, None).ttl(), Ok(DEFAULT_TTL_SECS));
        let mut t = r(None, None, None);
        t.ttl_secs = Some(0);
        assert!(t.ttl().is_err());
    }
}
