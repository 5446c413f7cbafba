//! The dominator in `paddock serve`: while this host leads, a [`Herd`] keeps every MDB
//! machine that has a RequiredImage and an address on that image. What operators decide
//! lives in the store, so any host can take it and the next leader honours it:
//!
//! | key | value |
//! |---|---|
//! | `dominator/pause` | [`Pause`]: every update held, with the reason |
//! | `dominator/subs/<hostname>` | [`SubControl`]: this sub paused, and its safety clearances |
//!
//! Routes (`/rpc/Dominator.*`): `ListSubs`, `GetSub?hostname=`, `Pause {reason}`, `Resume`,
//! `PauseSub {hostname, reason}`, `ResumeSub {hostname}`, `ClearSafety {hostname}`,
//! `UpdateSub {hostname, image}` (the machine's RequiredImage), `Status`. The census (every sub's state) is the leader's; other hosts answer with an
//! empty one and say who leads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_dominator::{
    Census, Change, Desired, Herd, HttpSubRpc, ImageSource, Limits, Overlay, Policy, RpcError,
    SubSpec, SubState, SubStatus,
};
use paddock_image::{Image, Machine, check_logical_name};
use paddock_imageserver::images::{ImageError, ImageServer};
use paddock_imageserver::mdb::{Entry, MdbService, MdbServiceError, Source};
use paddock_inspector::service::{Inspector, Subject};
use paddock_store::{Store, StoreError};
use paddock_wire::{ApiError, unix_ms};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::leader::LeaderRx;

pub const PAUSE: &str = "dominator/pause";
pub const SUBS: &str = "dominator/subs/";

/// The whole dominator paused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    pub reason: String,
    pub at_ms: i64,
}

/// An operator's word on one sub.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubControl {
    #[serde(default)]
    pub paused: Option<String>,
    /// Raised once per `clear-safety`.
    #[serde(default)]
    pub safety_clearance: u64,
}

/// What `Dominator.Status` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DominatorStatus {
    pub enabled: bool,
    pub leading: bool,
    pub paused: Option<Pause>,
    /// Subs per state (the leader's census).
    pub states: BTreeMap<String, usize>,
}

/// The image server's index as the herd's source of images.
pub struct ImageIndex(pub Arc<ImageServer>);

#[async_trait]
impl ImageSource for ImageIndex {
    async fn image(&self, name: &str) -> Result<Option<Arc<Image>>, RpcError> {
        match self.0.get(name).await {
            Ok(i) => Ok(Some(Arc::new(i))),
            Err(ImageError::NotFound(_)) => Ok(None),
            Err(e) => Err(RpcError(e.to_string())),
        }
    }
}

async fn read<T: for<'de> Deserialize<'de>>(
    store: &dyn Store,
    key: &str,
) -> Result<Option<T>, StoreError> {
    match store.get(key).await? {
        Some(kv) => Ok(serde_json::from_slice(&kv.value).ok()),
        None => Ok(None),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Mdb(#[from] MdbServiceError),
}

/// What gives each machine its computed files: rendered, stored as objects, laid over
/// its image by the herd.
#[async_trait]
pub trait Overlays: Send + Sync + 'static {
    /// Each machine's computed files (machines with none are left out).
    async fn overlays(&self, machines: &BTreeMap<String, Entry>) -> BTreeMap<String, Arc<Overlay>>;
    /// The store prefixes whose changes change them (besides the MDB's).
    fn watched(&self) -> Vec<String>;
}

/// Every sub the herd should keep ([`sub_specs`]), read from the store and the MDB, with
/// their computed files.
pub async fn specs(
    store: &dyn Store,
    mdb: &MdbService,
    subd_port: u16,
    overlays: Option<&dyn Overlays>,
) -> Result<Vec<SubSpec>, SpecsError> {
    let pause: Option<Pause> = read(store, PAUSE).await?;
    let controls: BTreeMap<String, SubControl> = store
        .range(SUBS)
        .await?
        .into_iter()
        .filter_map(|kv| {
            let host = kv.name_under(SUBS)?;
            Some((host, serde_json::from_slice(&kv.value).ok()?))
        })
        .collect();
    let machines = mdb.entries().await?;
    let overlays = match overlays {
        Some(o) => o.overlays(&machines).await,
        None => BTreeMap::new(),
    };
    let mut subs = sub_specs(machines.into_values(), &controls, pause.as_ref(), subd_port);
    for s in &mut subs {
        s.desired.computed = overlays.get(&s.hostname).cloned();
    }
    Ok(subs)
}

/// The subs of the MDB's machines, with the operator's pauses and clearances: every machine
/// with an address, except those only enrolled (recorded by the inspector, never given an
/// image by an operator or an installation): they run no subd yet, and polling them would
/// only find them unreachable, one connection attempt per poll interval each.
pub fn sub_specs(
    machines: impl IntoIterator<Item = Entry>,
    controls: &BTreeMap<String, SubControl>,
    pause: Option<&Pause>,
    subd_port: u16,
) -> Vec<SubSpec> {
    machines
        .into_iter()
        .filter(|e| !e.machine.ip_address.is_empty() && e.source != Source::Inspector)
        .map(|e| {
            let m = e.machine;
            let control = controls.get(&m.hostname).cloned().unwrap_or_default();
            let updates_disabled = if m.disable_updates {
                Some("DisableUpdates is set in the MDB".to_string())
            } else {
                control.paused.map(|r| format!("this sub is paused: {r}"))
            };
            let nonempty = |s: String| (!s.is_empty()).then_some(s);
            SubSpec {
                address: address(&m.ip_address, subd_port),
                desired: Desired {
                    required_image: nonempty(m.required_image),
                    planned_image: nonempty(m.planned_image),
                    updates_disabled,
                    disable_safety_check: m.tags.contains_key("DisableSafetyCheck"),
                    paused: pause.map(|p| p.reason.clone()),
                    force_disruption: m
                        .tags
                        .get("ForceDisruptiveUpdate")
                        .is_some_and(|v| v == "true"),
                    computed: None,
                },
                safety_clearance: control.safety_clearance,
                hostname: m.hostname,
            }
        })
        .collect()
}

/// `ip:port`, with brackets for an IPv6 address.
fn address(ip: &str, port: u16) -> String {
    if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The dominator's handles, for the routes.
#[derive(Clone)]
pub struct Dominator {
    pub store: Arc<dyn Store>,
    pub census: Census,
    pub leader: LeaderRx,
    pub enabled: bool,
    /// For `UpdateSub`: the machine's RequiredImage, checked against the image index.
    pub mdb: Arc<MdbService>,
    pub images: Arc<ImageServer>,
}

/// What the dominator runs on.
pub struct Wiring {
    pub store: Arc<dyn Store>,
    pub mdb: Arc<MdbService>,
    pub images: Arc<ImageServer>,
    /// Where subs fetch objects (this appliance's public URL).
    pub image_server_url: String,
    /// This host's name, as subd's client lock sees the dominator.
    pub host: String,
    /// For the machines' timelines.
    pub inspector: Arc<Inspector>,
    /// TLS to the subs: this host's certificate (the dominator's identity, `Subd.*`) and
    /// the CA they are checked against; `None`: plain HTTP (insecure mode).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Asked before an update that reboots a machine or runs a high-impact trigger.
    pub disruption: Option<Arc<dyn paddock_dominator::DisruptionCheck>>,
    /// The machines' computed files.
    pub overlays: Option<Arc<dyn Overlays>>,
    /// Notified each time a sub turns synced (provisioning then looks at the census at once).
    pub synced: Arc<tokio::sync::Notify>,
}

/// Starts the dominator: specs are rebuilt when the MDB or a control changes (and every
/// few seconds), and a herd runs while this host leads.
pub fn start(rt: &mut crate::runtime::Runtime, cfg: &DominatorConfig, w: Wiring) -> Census {
    let Wiring {
        store,
        mdb,
        images,
        image_server_url,
        host,
        inspector,
        tls,
        disruption,
        overlays,
        synced,
    } = w;
    let (changes_tx, changes_rx) = tokio::sync::mpsc::unbounded_channel();
    rt.spawn_future("dominator: changes", async move {
        record_changes(inspector, changes_rx, &synced).await;
        Ok(())
    });
    let census = Census::default();
    let (specs_tx, specs_rx) = watch::channel(Vec::new());
    {
        let (store, port) = (store.clone(), cfg.subd_port);
        rt.spawn_future("dominator: specs", async move {
            follow_specs(store, mdb, port, overlays, specs_tx).await;
            Ok(())
        });
    }
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let policy = Policy {
        poll_interval_ms: ms(cfg.poll_interval),
        disruption_retry_ms: ms(cfg.disruption_retry),
        ..Policy::default()
    };
    let limits = Limits {
        poll_slots: cfg.max_polls,
        update_slots: cfg.max_updates,
        image_server: image_server_url,
        fetch_speed_percent: cfg.fetch_speed_percent,
        high_impact_share: cfg.high_impact_share,
    };
    let rpc = Arc::new(match tls {
        Some(tls) => HttpSubRpc::with_tls(&format!("paddock-{host}"), Duration::from_secs(5), tls),
        None => HttpSubRpc::new(&format!("paddock-{host}"), Duration::from_secs(5)),
    });
    let images = Arc::new(ImageIndex(images));
    let c = census.clone();
    rt.while_leading("dominator: herd", move |ctx, _fence| {
        let herd = Herd::new(
            rpc.clone(),
            images.clone(),
            policy.clone(),
            limits.clone(),
            c.clone(),
        )
        .with_changes(changes_tx.clone());
        let herd = match &disruption {
            Some(check) => herd.with_disruption_check(check.clone()),
            None => herd,
        };
        let (specs_rx, c) = (specs_rx.clone(), c.clone());
        async move {
            tracing::info!("dominator: this host leads; keeping the subs");
            let (stop_tx, stop_rx) = watch::channel(false);
            let epoch = Instant::now();
            let run = tokio::spawn(herd.run(specs_rx, stop_rx, move || {
                u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
            }));
            ctx.cancel.cancelled().await;
            let _ = stop_tx.send(true);
            let _ = run.await;
            c.write().unwrap_or_else(|p| p.into_inner()).clear();
            tracing::info!("dominator: no longer leading; stopped");
        }
    });
    census
}

/// Files every change of a sub's state on the timeline of the node of the same name (the
/// MDB names enrolled machines by their node's name), or of the unnamed node whose hostname
/// is `node-<8 hex>` (provisioning names them so); a sub with no node is not recorded.
/// A change to synced notifies `synced` first, before the timeline's writes.
async fn record_changes(
    inspector: Arc<Inspector>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Change>,
    synced: &tokio::sync::Notify,
) {
    let mut nodes = crate::provisioning::NodesByHostname::default();
    while let Some(change) = rx.recv().await {
        if matches!(change.state, SubState::Synced { .. }) {
            synced.notify_one();
        }
        let Change {
            hostname: host,
            state,
            report,
        } = change;
        let node = match nodes.find(&inspector, &host).await {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(%host, error = %e, "dominator: timeline entry not recorded");
                continue;
            }
        };
        let failed_update = report
            .as_ref()
            .and_then(|r| r.update.as_ref())
            .is_some_and(|u| u.error.is_some() || u.trigger_failures || u.apply.error_count > 0);
        let error = failed_update
            || matches!(
                state,
                SubState::Unreachable { .. }
                    | SubState::Error { .. }
                    | SubState::UnsafeUpdate { .. }
                    | SubState::NotEnoughSpace { .. }
                    | SubState::ImageMissing { .. }
            );
        // The change that ends a cycle says what the cycle did: the plan, the bytes
        // fetched, the change window, the triggers and their results, the errors.
        let message = match report {
            Some(r) => format!("dominator: {state}; {}", r.describe()),
            None => format!("dominator: {state}"),
        };
        if let Err(e) = inspector
            .event(Subject::Node(node.uuid), "dominator", &message, error)
            .await
        {
            tracing::debug!(%host, error = %e, "dominator: timeline entry not recorded");
        }
    }
}

async fn follow_specs(
    store: Arc<dyn Store>,
    mdb: Arc<MdbService>,
    subd_port: u16,
    overlays: Option<Arc<dyn Overlays>>,
    tx: watch::Sender<Vec<SubSpec>>,
) {
    let mut prefixes = vec!["mdb/".to_string(), "dominator/".to_string()];
    if let Some(o) = &overlays {
        prefixes.extend(o.watched());
    }
    'watching: loop {
        // The watches start before the first read, so no change falls between the two;
        // they are kept while they last (any change under one rebuilds at once, a burst
        // once; else every 5 s).
        let (wtx, mut wrx) = tokio::sync::mpsc::channel::<bool>(64);
        let mut watchers = tokio::task::JoinSet::new();
        for prefix in &prefixes {
            match store.watch(prefix, 0).await {
                Ok(mut w) => {
                    let wtx = wtx.clone();
                    watchers.spawn(async move {
                        while let Some(Ok(_)) = w.next().await {
                            if wtx.send(true).await.is_err() {
                                return;
                            }
                        }
                        let _ = wtx.send(false).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dominator: cannot watch the MDB; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'watching;
                }
            }
        }
        loop {
            match specs(&*store, &mdb, subd_port, overlays.as_deref()).await {
                Ok(s) => {
                    tx.send_if_modified(|old| {
                        let changed = *old != s;
                        if changed {
                            *old = s;
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!(error = %e, "dominator: cannot read the MDB and controls"),
            }
            let mut ended = tokio::select! {
                ev = wrx.recv() => ev != Some(true),
                _ = tokio::time::sleep(Duration::from_secs(5)) => false,
            };
            while let Ok(more) = wrx.try_recv() {
                ended |= !more;
            }
            if ended {
                break;
            }
        }
    }
}

pub fn router(d: Dominator) -> Router {
    Router::new()
        .route("/rpc/Dominator.ListSubs", get(list_subs))
        .route("/rpc/Dominator.GetSub", get(get_sub))
        .route("/rpc/Dominator.Status", get(status))
        .route("/rpc/Dominator.Pause", post(pause))
        .route("/rpc/Dominator.Resume", post(resume))
        .route("/rpc/Dominator.PauseSub", post(pause_sub))
        .route("/rpc/Dominator.ResumeSub", post(resume_sub))
        .route("/rpc/Dominator.ClearSafety", post(clear_safety))
        .route("/rpc/Dominator.UpdateSub", post(update_sub))
        .with_state(d)
}

fn store_err(e: StoreError) -> ApiError {
    ApiError::internal(e.to_string())
}

async fn list_subs(State(d): State<Dominator>) -> Json<Vec<SubStatus>> {
    Json(
        d.census
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect(),
    )
}

#[derive(Deserialize)]
struct HostQuery {
    hostname: String,
}

async fn get_sub(
    State(d): State<Dominator>,
    Query(q): Query<HostQuery>,
) -> Result<Json<SubStatus>, ApiError> {
    let census = d.census.read().unwrap_or_else(|p| p.into_inner());
    census.get(&q.hostname).cloned().map(Json).ok_or_else(|| {
        let why = if d.leader.borrow().is_some() {
            "it is not in the MDB with an address"
        } else {
            "this host does not lead; ask the leader"
        };
        ApiError::not_found(format!("no sub {:?}: {why}", q.hostname))
    })
}

async fn status(State(d): State<Dominator>) -> Result<Json<DominatorStatus>, ApiError> {
    let paused = read(&*d.store, PAUSE).await.map_err(store_err)?;
    let mut states = BTreeMap::new();
    for s in d.census.read().unwrap_or_else(|p| p.into_inner()).values() {
        *states.entry(s.state.name().to_string()).or_insert(0) += 1;
    }
    Ok(Json(DominatorStatus {
        enabled: d.enabled,
        leading: d.leader.borrow().is_some(),
        paused,
        states,
    }))
}

#[derive(Deserialize)]
struct Reason {
    reason: String,
}

fn check_reason(reason: &str) -> Result<String, ApiError> {
    let r = reason.trim();
    if r.is_empty() || r.len() > 500 || r.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "a reason is required: one line of at most 500 characters",
        ));
    }
    Ok(r.to_string())
}

async fn pause(State(d): State<Dominator>, Json(r): Json<Reason>) -> Result<Json<Pause>, ApiError> {
    pause_all(&d, &r.reason).await.map(Json)
}

async fn resume(State(d): State<Dominator>) -> Result<Json<serde_json::Value>, ApiError> {
    resume_all(&d).await?;
    Ok(Json(serde_json::json!({"paused": false})))
}

/// `Dominator.Pause`: every update held, with the operator's reason (the API and console).
pub async fn pause_all(d: &Dominator, reason: &str) -> Result<Pause, ApiError> {
    let p = Pause {
        reason: check_reason(reason)?,
        at_ms: unix_ms(),
    };
    let value = serde_json::to_vec(&p).map_err(|e| ApiError::internal(e.to_string()))?;
    d.store.put(PAUSE, value).await.map_err(store_err)?;
    tracing::warn!(reason = %p.reason, "dominator: paused");
    Ok(p)
}

/// `Dominator.Resume` (the API and console).
pub async fn resume_all(d: &Dominator) -> Result<(), ApiError> {
    d.store.delete(PAUSE).await.map_err(store_err)?;
    tracing::info!("dominator: resumed");
    Ok(())
}

#[derive(Deserialize)]
struct HostReason {
    hostname: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Reads, changes and writes a sub's control in one compare-and-swap (retried on a race).
async fn change_control(
    d: &Dominator,
    hostname: &str,
    f: impl Fn(&mut SubControl),
) -> Result<SubControl, ApiError> {
    check_logical_name(hostname).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let key = format!("{SUBS}{hostname}");
    for _ in 0..10 {
        let old = d.store.get(&key).await.map_err(store_err)?;
        let mut c: SubControl = old
            .as_ref()
            .and_then(|kv| serde_json::from_slice(&kv.value).ok())
            .unwrap_or_default();
        f(&mut c);
        let value = serde_json::to_vec(&c).map_err(|e| ApiError::internal(e.to_string()))?;
        let cmp = paddock_store::Compare::ModRevision {
            key: key.clone(),
            revision: old.as_ref().map_or(0, |kv| kv.mod_revision),
        };
        let txn = paddock_store::Txn {
            compare: vec![cmp],
            success: vec![paddock_store::Op::Put {
                key: key.clone(),
                value,
                lease: None,
            }],
            ..paddock_store::Txn::default()
        };
        if d.store.txn(txn).await.map_err(store_err)?.succeeded {
            return Ok(c);
        }
    }
    Err(ApiError::new(
        409,
        format!("sub {hostname}: changed by others too often; try again"),
    ))
}

async fn pause_sub(
    State(d): State<Dominator>,
    Json(r): Json<HostReason>,
) -> Result<Json<SubControl>, ApiError> {
    let reason = r.reason.as_deref().unwrap_or_default();
    pause_one(&d, &r.hostname, reason).await.map(Json)
}

async fn resume_sub(
    State(d): State<Dominator>,
    Json(r): Json<HostReason>,
) -> Result<Json<SubControl>, ApiError> {
    resume_one(&d, &r.hostname).await.map(Json)
}

/// `Dominator.PauseSub`: one sub's updates held, with the operator's reason.
pub async fn pause_one(
    d: &Dominator,
    hostname: &str,
    reason: &str,
) -> Result<SubControl, ApiError> {
    let reason = check_reason(reason)?;
    change_control(d, hostname, |c| c.paused = Some(reason.clone())).await
}

/// `Dominator.ResumeSub`.
pub async fn resume_one(d: &Dominator, hostname: &str) -> Result<SubControl, ApiError> {
    change_control(d, hostname, |c| c.paused = None).await
}

async fn clear_safety(
    State(d): State<Dominator>,
    Json(r): Json<HostReason>,
) -> Result<Json<SubControl>, ApiError> {
    let c = change_control(&d, &r.hostname, |c| {
        c.safety_clearance = c.safety_clearance.saturating_add(1)
    })
    .await?;
    tracing::warn!(hostname = %r.hostname, "dominator: safety hold cleared by an operator");
    Ok(Json(c))
}

/// The dominator: how it reaches subs and how hard it pushes.
#[derive(Clone, Debug)]
pub struct DominatorConfig {
    pub subd_port: u16,
    pub max_updates: usize,
    pub max_polls: usize,
    pub poll_interval: Duration,
    pub fetch_speed_percent: f64,
    /// Share of the subs that may run a high-impact or reboot update at once.
    pub high_impact_share: f64,
    /// The program asked whether a machine may be disrupted (see `crate::disruption`).
    pub disruption_check: Option<std::path::PathBuf>,
    pub disruption_retry: Duration,
    pub disruption_timeout: Duration,
}

/// A sub as the census holds it, for the tests of what shows subs.
#[cfg(test)]
pub(crate) fn test_sub(
    hostname: &str,
    state: paddock_dominator::SubState,
) -> paddock_dominator::SubStatus {
    paddock_dominator::SubStatus {
        hostname: hostname.into(),
        address: "198.18.0.9:6969".into(),
        required_image: Some("debian/minbase.1".into()),
        summary: state.to_string(),
        failures: u32::from(!matches!(state, paddock_dominator::SubState::Synced { .. })) * 2,
        state,
        health: None,
        fetch: None,
        since_ms: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enrolled_machines_are_not_polled() {
        let entry = |host: &str, ip: &str, image: &str, source| Entry {
            machine: Machine {
                hostname: host.into(),
                ip_address: ip.into(),
                required_image: image.into(),
                ..Machine::default()
            },
            source,
        };
        let machines = [
            entry("enrolled", "198.18.0.5", "", Source::Inspector),
            entry("installed", "198.18.0.6", "debian/a", Source::Api),
            entry("listed", "198.18.0.7", "", Source::File),
            entry("no-address", "", "debian/a", Source::Api),
        ];
        let pause = Pause {
            reason: "freeze".into(),
            at_ms: 1,
        };
        let subs = sub_specs(machines, &BTreeMap::new(), Some(&pause), 6969);
        let hosts: Vec<(&str, &str)> = subs
            .iter()
            .map(|s| (s.hostname.as_str(), s.address.as_str()))
            .collect();
        assert_eq!(
            hosts,
            [
                ("installed", "198.18.0.6:6969"),
                ("listed", "198.18.0.7:6969")
            ]
        );
        assert_eq!(subs[0].desired.required_image.as_deref(), Some("debian/a"));
        assert_eq!(subs[1].desired.required_image, None);
        assert_eq!(subs[0].desired.paused.as_deref(), Some("freeze"));
    }

    #[test]
    fn addresses_and_reasons() {
        assert_eq!(address("198.18.0.9", 6969), "198.18.0.9:6969");
        assert_eq!(address("fd00::9", 6969), "[fd00::9]:6969");
        assert!(check_reason("  ").is_err());
        assert!(check_reason("freeze\nrm -rf").is_err());
        assert_eq!(check_reason(" change freeze ").unwrap(), "change freeze");
    }
}

#[derive(Deserialize)]
struct UpdateSub {
    hostname: String,
    image: String,
}

/// `Dominator.UpdateSub {hostname, image}`: the machine's RequiredImage becomes `image` (an
/// image that exists); its other MDB fields are kept. The herd picks it up at once (it
/// watches the MDB). The machine must be in the MDB already: its address comes from there.
pub async fn set_required_image(
    d: &Dominator,
    hostname: &str,
    image: &str,
) -> Result<Machine, ApiError> {
    check_logical_name(hostname).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let image = image.trim();
    match d.images.record(image).await {
        Ok(Some(r)) if !r.deleted => {}
        Ok(_) => {
            return Err(ApiError::not_found(format!(
                "no image {image:?}: add it first (paddock image add)"
            )));
        }
        Err(e) => return Err(ApiError::from(e)),
    }
    let m = d
        .mdb
        .update(hostname, |m| m.required_image = image.to_string())
        .await
        .map_err(|e| match e {
            paddock_imageserver::mdb::MdbServiceError::NotFound(_) => ApiError::not_found(format!(
                "no machine {hostname:?} in the MDB: add it with paddock mdb set"
            )),
            e => ApiError::from(e),
        })?;
    tracing::info!(%hostname, %image, "dominator: RequiredImage set");
    Ok(m)
}

async fn update_sub(
    State(d): State<Dominator>,
    Json(u): Json<UpdateSub>,
) -> Result<Json<Machine>, ApiError> {
    set_required_image(&d, &u.hostname, &u.image)
        .await
        .map(Json)
}
