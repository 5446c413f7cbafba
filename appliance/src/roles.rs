//! Keep the appliance alive: the shell around `paddock_roles`. The spec lives in
//! the store (`roles/spec`, put by `paddock spec apply` after validation: a bad spec changes
//! nothing); the leader re-plans on every census or spec change (debounced) and on a timer,
//! runs the plan's actions in order through the hook executor (no shell, fixed environment,
//! timeout, exit status and output kept), sets image roles' required image in the MDB, and
//! keeps every round's input and output (`roles/rounds/<ms>`) for replay.
//!
//! An image role's start sets the host's RequiredImage in the MDB and records the instance
//! under `roles/images/<role>/<instance>`; the instance counts while the dominator's census
//! (the leader's) shows the host's sub on its way to that image or synced to it
//! ([`image_instances`]), and stops counting when the sub is unreachable or fails, so a dead
//! host's image roles are started elsewhere.
//!
//! Between a hook's success and its instance's registration the round remembers what it
//! did (`Pending`), so a re-plan in between does not start the same instance twice; a start
//! that failed leaves its host alone for `quarantine`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use paddock_inspector::service::Subject;
use paddock_roles::{Action, Census, Instance, Kind, Outcome, Plan, Spec, SpecErrors};
use paddock_store::{Compare, Op, Store, Txn};
use paddock_wire::{ApiError, unix_ms};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::census::CensusService;

pub const SPEC_KEY: &str = "roles/spec";
/// `roles/shadow/<name>`: a [`StoredSpec`] planned every round beside the live one, never
/// acted on.
pub const SHADOWS: &str = "roles/shadow/";
pub const ROUNDS: &str = "roles/rounds/";
/// `roles/images/<role>/<instance>`: `{host, image}`, an image role's instance started on a
/// host (its required image set); removed when the instance is stopped.
pub const IMAGES: &str = "roles/images/";
/// How often a round runs while a rollout is under way.
const ROLLOUT_STEP: Duration = Duration::from_secs(1);
/// How long a rollout's step waits for the dominator to take a machine's new image.
const MDB_FOLLOWED: Duration = Duration::from_secs(2);
/// Rounds kept in the store (the oldest are deleted).
const ROUNDS_KEPT: usize = 200;
/// Bytes of a hook's stdout and stderr kept (the tail).
pub const OUTPUT_TAIL: usize = 4096;

/// `[roles]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolesFile {
    /// The hooks directory; the role loop runs only when it is set.
    pub hooks_dir: Option<PathBuf>,
    /// Seconds a hook may run before it is killed ([`ROLES_HOOK_TIMEOUT_SECS`]).
    pub hook_timeout_secs: Option<u64>,
    /// Seconds between rounds when nothing changes ([`ROLES_ROUND_SECS`]).
    pub round_secs: Option<u64>,
    /// Milliseconds a census or spec change waits for more before the round ([`ROLES_DEBOUNCE_MS`]).
    pub debounce_ms: Option<u64>,
    /// Seconds a host where a start failed is left alone ([`ROLES_QUARANTINE_SECS`]).
    pub quarantine_secs: Option<u64>,
    /// Seconds a started instance has to register before the plan counts it missing
    /// ([`ROLES_REGISTER_GRACE_SECS`]).
    pub register_grace_secs: Option<u64>,
    /// The hooks' state directory, `PADDOCK_HOOK_STATE` (default `<data_dir>/hooks`).
    pub state_dir: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct RolesConfig {
    pub hooks_dir: PathBuf,
    pub hook_timeout: Duration,
    pub round_every: Duration,
    pub debounce: Duration,
    pub quarantine: Duration,
    pub register_grace: Duration,
    pub state_dir: PathBuf,
}

/// `[roles]` → the loop's settings (`None`: no hooks directory, the loop is off).
pub fn validate(
    f: &RolesFile,
    data_dir: &std::path::Path,
    p: &mut Vec<String>,
) -> Option<RolesConfig> {
    let hooks_dir = f.hooks_dir.clone()?;
    if !hooks_dir.is_absolute() {
        p.push(format!(
            "roles.hooks_dir: {} must be an absolute path",
            hooks_dir.display()
        ));
    }
    let mut secs = |name: &str, v: Option<u64>, default: u64, max: u64| {
        let v = v.unwrap_or(default);
        if !(1..=max).contains(&v) {
            p.push(format!("roles.{name}: {v} must be 1 to {max}"));
        }
        v
    };
    let hook_timeout = secs(
        "hook_timeout_secs",
        f.hook_timeout_secs,
        ROLES_HOOK_TIMEOUT_SECS,
        3_600,
    );
    let round = secs("round_secs", f.round_secs, ROLES_ROUND_SECS, 3_600);
    let debounce = secs("debounce_ms", f.debounce_ms, ROLES_DEBOUNCE_MS, 60_000);
    let quarantine = secs(
        "quarantine_secs",
        f.quarantine_secs,
        ROLES_QUARANTINE_SECS,
        86_400,
    );
    let grace = secs(
        "register_grace_secs",
        f.register_grace_secs,
        ROLES_REGISTER_GRACE_SECS,
        3_600,
    );
    Some(RolesConfig {
        hooks_dir,
        hook_timeout: Duration::from_secs(hook_timeout),
        round_every: Duration::from_secs(round),
        debounce: Duration::from_millis(debounce),
        quarantine: Duration::from_secs(quarantine),
        register_grace: Duration::from_secs(grace),
        state_dir: f
            .state_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("hooks")),
    })
}

/// The spec as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSpec {
    pub file: String,
    pub text: String,
    #[serde(default)]
    pub applied_ms: i64,
    /// The templates its computed files are made from, by name (applied with it, so a
    /// spec and its templates change together).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub templates: BTreeMap<String, String>,
}

/// The most template text a spec may carry, all templates together.
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// Why a spec's templates are refused.
#[derive(Debug, thiserror::Error)]
pub enum TemplatesError {
    #[error("template {0} is not among the templates sent (templates/{0} beside the spec)")]
    Missing(String),
    #[error("the templates hold {0} bytes; at most {MAX_TEMPLATE_BYTES}")]
    TooLarge(usize),
    #[error(transparent)]
    Invalid(#[from] paddock_computed::RenderError),
}

/// The templates `spec` names, from `sent`: each must be there and compile; the others are
/// dropped.
pub fn spec_templates(
    spec: &Spec,
    sent: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, TemplatesError> {
    let mut out = BTreeMap::new();
    let mut bytes = 0usize;
    for name in spec.templates() {
        let Some(text) = sent.get(&name) else {
            return Err(TemplatesError::Missing(name));
        };
        bytes = bytes.saturating_add(text.len());
        out.insert(name, text.clone());
    }
    if bytes > MAX_TEMPLATE_BYTES {
        return Err(TemplatesError::TooLarge(bytes));
    }
    paddock_computed::Templates::new(&out)?;
    Ok(out)
}

/// What one action did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionResult {
    pub action: Action,
    /// The hook's argument vector (none for an image role without a hook).
    pub argv: Option<Vec<String>>,
    pub ok: bool,
    pub exit: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub error: Option<String>,
    pub ms: u64,
}

/// One round: its input (spec, census) and output (plan, results), for replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    pub at_ms: i64,
    pub spec: StoredSpec,
    pub census: Census,
    pub plan: Plan,
    pub results: Vec<ActionResult>,
    /// Each scaled role's count for this round, and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scale: BTreeMap<String, paddock_roles::Decision>,
    /// What the scaled roles' history was before the round (a replay starts from it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scale_before: BTreeMap<String, paddock_roles::ScaleState>,
    /// Each shadow spec's plan for the same census and metrics (nothing of it is run).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shadows: BTreeMap<String, ShadowPlan>,
}

/// A shadow spec's plan in a round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowPlan {
    pub file: String,
    pub plan: Plan,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scale: BTreeMap<String, paddock_roles::Decision>,
}

/// Where a shadow's plan and the live one differ: per role, the live and the shadow's
/// target counts, where they differ.
pub fn shadow_differences(live: &Plan, shadow: &Plan) -> Vec<(String, Option<u64>, Option<u64>)> {
    let roles: std::collections::BTreeSet<&String> =
        live.roles.keys().chain(shadow.roles.keys()).collect();
    roles
        .into_iter()
        .filter_map(|r| {
            let a = live.roles.get(r).map(|c| c.target);
            let b = shadow.roles.get(r).map(|c| c.target);
            (a != b).then(|| (r.clone(), a, b))
        })
        .collect()
}

/// A round planned again ([`Roles::replay`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replayed {
    pub spec_file: String,
    pub plan: Plan,
    pub scale: BTreeMap<String, paddock_roles::Decision>,
    /// The plan the round recorded.
    pub recorded: Plan,
    /// The replay planned what the round did.
    pub same: bool,
}

/// A plan preview: the plan and each action's command line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanPreview {
    pub spec_file: String,
    pub census: Census,
    pub plan: Plan,
    pub commands: Vec<Option<Vec<String>>>,
}

/// An image role's instance: the host whose required image the start set.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ImageInstance {
    pub host: String,
    pub image: String,
}

/// The machines Paddock installed that count as live hosts without registering: those whose
/// subd the dominator reaches (synced, or being brought to its image). An enrolled machine
/// that was provisioned is thus a host as soon as its installed system answers, and stops
/// being one when its subd goes unreachable, as a registration's lease would expire.
pub fn live_sub_hosts(
    subs: &BTreeMap<String, paddock_dominator::SubStatus>,
) -> std::collections::BTreeSet<String> {
    subs.iter()
        .filter(|(_, s)| sub_alive(&s.state))
        .map(|(h, _)| h.clone())
        .collect()
}

fn sub_alive(state: &paddock_dominator::SubState) -> bool {
    use paddock_dominator::SubState as S;
    matches!(
        state,
        S::Synced { .. }
            | S::Polling
            | S::Computing
            | S::Queued { .. }
            | S::Fetching { .. }
            | S::WaitingForScan { .. }
            | S::Updating
            | S::AskingDisruption
            | S::DisruptionDenied { .. }
    )
}

/// The image roles' instances alive by the dominator's census: a host still being brought to
/// the image (polled, fetching, updating …) or synced to it. An unreachable or failing sub,
/// one on another image, or a host the dominator does not know, does not count.
pub fn image_instances(
    assigned: &[(String, String, ImageInstance)],
    subs: &BTreeMap<String, paddock_dominator::SubStatus>,
) -> Vec<Instance> {
    use paddock_dominator::SubState as S;
    assigned
        .iter()
        .filter(|(_, _, a)| {
            subs.get(&a.host).is_some_and(|s| {
                s.required_image.as_deref() == Some(a.image.as_str())
                    && match &s.state {
                        S::Synced { image } => *image == a.image,
                        other => sub_alive(other),
                    }
            })
        })
        .map(|(role, id, a)| Instance {
            role: role.clone(),
            id: id.clone(),
            host: Some(a.host.clone()),
        })
        .collect()
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SpecBody {
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    /// The templates the spec's computed files name, by name.
    #[serde(default)]
    pub templates: BTreeMap<String, String>,
}

struct Pending {
    instance: Instance,
    kind: Kind,
    until: Instant,
}

#[derive(Default)]
struct Memory {
    pending: Vec<Pending>,
    quarantine: BTreeMap<String, Instant>,
    last_outcome: Option<Outcome>,
    /// The scaled roles' history (a new leader starts from the last kept round's counts).
    scale: Option<BTreeMap<String, paddock_roles::ScaleState>>,
    /// Each shadow spec's scaled roles' history.
    shadow_scale: BTreeMap<String, BTreeMap<String, paddock_roles::ScaleState>>,
    /// The shadow plans of the last round, to keep a round when they change.
    last_shadows: BTreeMap<String, ShadowPlan>,
    /// What `/metrics` shows of the last round.
    last_round: Option<RoundStats>,
}

/// The last round, as `/metrics` shows it: per role the instances counted and the plan's
/// target, the actions planned, the round's length.
#[derive(Clone, Debug, Default)]
pub struct RoundStats {
    pub roles: BTreeMap<String, (u64, u64)>,
    pub actions: usize,
    pub seconds: f64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

/// `text` (an OpenMetrics exposition) with the role loop's last round (on the leader):
/// `paddock_role_instances{role}`, `paddock_role_desired{role}` (the plan's target: a
/// scaled role's load-driven count), `paddock_role_round_actions` and
/// `paddock_role_round_seconds`.
pub fn add_metrics(text: String, stats: Option<&RoundStats>) -> String {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let Some(stats) = stats else {
        return text;
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let (instances, desired) = (
        Family::<RoleLabels, Gauge>::default(),
        Family::<RoleLabels, Gauge>::default(),
    );
    for (role, (current, target)) in &stats.roles {
        let l = RoleLabels { role: role.clone() };
        instances
            .get_or_create(&l)
            .set(i64::try_from(*current).unwrap_or(i64::MAX));
        desired
            .get_or_create(&l)
            .set(i64::try_from(*target).unwrap_or(i64::MAX));
    }
    registry.register(
        "paddock_role_instances",
        "Live instances of each role, as the last round counted them",
        instances,
    );
    registry.register(
        "paddock_role_desired",
        "Each role's target in the last round's plan (a scaled role's count from its load)",
        desired,
    );
    let actions = Gauge::<i64>::default();
    actions.set(i64::try_from(stats.actions).unwrap_or(i64::MAX));
    registry.register(
        "paddock_role_round_actions",
        "Actions the last round planned",
        actions,
    );
    let seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    seconds.set(stats.seconds);
    registry.register(
        "paddock_role_round_seconds",
        "How long the last round took",
        seconds,
    );
    crate::metrics::append(text, &registry)
}

pub struct Roles {
    pub store: Arc<dyn Store>,
    pub census: CensusService,
    pub dominator: crate::dominator::Dominator,
    pub config: Option<RolesConfig>,
    pub public_url: String,
    pub leader: crate::leader::LeaderRx,
    memory: Mutex<Memory>,
    wake: tokio::sync::Notify,
    /// A rollout is under way: rounds every [`ROLLOUT_STEP`].
    rolling: std::sync::atomic::AtomicBool,
}

fn spec_errors(e: &SpecErrors) -> ApiError {
    ApiError::bad_request(e.to_string())
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

/// The tail of a hook's output, as text.
fn tail(bytes: &[u8]) -> String {
    let from = bytes.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

impl Roles {
    pub fn new(
        store: Arc<dyn Store>,
        census: CensusService,
        dominator: crate::dominator::Dominator,
        config: Option<RolesConfig>,
        public_url: String,
        leader: crate::leader::LeaderRx,
    ) -> Arc<Self> {
        Arc::new(Roles {
            store,
            census,
            dominator,
            config,
            public_url,
            leader,
            memory: Mutex::new(Memory::default()),
            wake: tokio::sync::Notify::new(),
            rolling: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub async fn stored_spec(&self) -> anyhow::Result<Option<StoredSpec>> {
        Ok(match self.store.get(SPEC_KEY).await? {
            Some(kv) => Some(serde_json::from_slice(&kv.value)?),
            None => None,
        })
    }

    /// Validates and stores a spec; a bad one changes nothing.
    pub async fn apply(
        &self,
        file: &str,
        text: &str,
        templates: &BTreeMap<String, String>,
    ) -> Result<Spec, ApiError> {
        let spec = Spec::parse(file, text).map_err(|e| spec_errors(&e))?;
        let templates = spec_templates(&spec, templates)
            .map_err(|e| ApiError::bad_request(format!("{file}: {e}; nothing applied")))?;
        let stored = StoredSpec {
            file: file.to_string(),
            text: text.to_string(),
            applied_ms: unix_ms(),
            templates,
        };
        self.store
            .put(SPEC_KEY, serde_json::to_vec(&stored).map_err(internal)?)
            .await
            .map_err(internal)?;
        self.wake.notify_one();
        Ok(spec)
    }

    /// The census as the planner sees it now: the live registrations, plus the instances
    /// this host started that have yet to register, minus those it stopped that have yet
    /// to go; quarantined hosts.
    async fn live_census(&self) -> anyhow::Result<(Census, BTreeMap<String, uuid::Uuid>)> {
        let subs = self.subs();
        let (mut census, uuids) = self.census.census(&live_sub_hosts(&subs)).await?;
        let assigned = self.assigned().await?;
        for i in image_instances(&assigned, &subs) {
            if !census
                .instances
                .iter()
                .any(|x| x.role == i.role && x.id == i.id)
            {
                census.instances.push(i);
            }
        }
        let now = Instant::now();
        let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        m.pending.retain(|p| {
            let present = census
                .instances
                .iter()
                .any(|i| i.role == p.instance.role && i.id == p.instance.id);
            let settled = match p.kind {
                Kind::Start => present,
                Kind::Stop => !present,
            };
            p.until > now && !settled
        });
        for p in &m.pending {
            match p.kind {
                Kind::Start => census.instances.push(p.instance.clone()),
                Kind::Stop => census
                    .instances
                    .retain(|i| !(i.role == p.instance.role && i.id == p.instance.id)),
            }
        }
        m.quarantine.retain(|_, until| *until > now);
        census.quarantined = m.quarantine.keys().cloned().collect();
        Ok((census, uuids))
    }

    /// The spec in force (none, or one that no longer validates: none) and the instances
    /// live on `host` by the census the planner sees.
    pub async fn on_host(&self, host: &str) -> anyhow::Result<(Option<Spec>, Vec<Instance>)> {
        let spec = self
            .stored_spec()
            .await?
            .and_then(|s| Spec::parse(&s.file, &s.text).ok());
        let (census, _) = self.live_census().await?;
        let mine = census
            .instances
            .into_iter()
            .filter(|i| i.host.as_deref() == Some(host))
            .collect();
        Ok((spec, mine))
    }

    /// The dominator's census (this host's, which is the leader's while it leads).
    fn subs(&self) -> BTreeMap<String, paddock_dominator::SubStatus> {
        self.dominator
            .census
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The image roles' instances: `(role, instance, {host, image})`.
    async fn assigned(&self) -> anyhow::Result<Vec<(String, String, ImageInstance)>> {
        let mut assigned = Vec::new();
        for kv in self.store.range(IMAGES).await? {
            let Some((role, id)) = kv.key[IMAGES.len()..].split_once('/') else {
                continue;
            };
            if let Ok(a) = serde_json::from_slice::<ImageInstance>(&kv.value) {
                assigned.push((role.to_string(), id.to_string(), a));
            }
        }
        Ok(assigned)
    }

    /// `paddock spec plan`: the plan for the live census, nothing run.
    pub async fn preview(&self, body: &SpecBody) -> Result<PlanPreview, ApiError> {
        let (file, text) = match (&body.file, &body.text) {
            (file, Some(text)) => (file.clone().unwrap_or_else(|| "spec".into()), text.clone()),
            (_, None) => match self.stored_spec().await.map_err(internal)? {
                Some(s) => (s.file, s.text),
                None => {
                    return Err(ApiError::not_found(
                        "no spec applied yet: paddock spec apply FILE, or send one",
                    ));
                }
            },
        };
        let spec = Spec::parse(&file, &text).map_err(|e| spec_errors(&e))?;
        let (census, _) = self.live_census().await.map_err(internal)?;
        // The scaled roles' counts as the next round would decide them (nothing kept).
        let mut states = self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .scale
            .clone()
            .unwrap_or_default();
        let (plan, _) = paddock_roles::round_plan(&spec, &census, &mut states, unix_ms());
        let commands = plan
            .actions
            .iter()
            .map(|a| a.command(&spec).ok().flatten())
            .collect();
        Ok(PlanPreview {
            spec_file: file,
            census,
            plan,
            commands,
        })
    }

    /// `paddock spec replay`: the round kept at `at_ms` planned again from its record (its
    /// census, its scaled roles' history, its time) with its own spec or `body`'s.
    pub async fn replay(&self, at_ms: i64, body: &SpecBody) -> Result<Replayed, ApiError> {
        let key = format!("{ROUNDS}{at_ms:013}");
        let Some(kv) = self.store.get(&key).await.map_err(internal)? else {
            return Err(ApiError::not_found(format!(
                "no round kept at {at_ms} (paddock spec rounds lists them)"
            )));
        };
        let round: Round = serde_json::from_slice(&kv.value).map_err(internal)?;
        let (file, text) = match (&body.file, &body.text) {
            (file, Some(text)) => (file.clone().unwrap_or_else(|| "spec".into()), text.clone()),
            (_, None) => (round.spec.file.clone(), round.spec.text.clone()),
        };
        let spec = Spec::parse(&file, &text).map_err(|e| spec_errors(&e))?;
        let mut states = round.scale_before.clone();
        let (plan, scale) =
            paddock_roles::round_plan(&spec, &round.census, &mut states, round.at_ms);
        Ok(Replayed {
            same: plan == round.plan,
            spec_file: file,
            plan,
            scale,
            recorded: round.plan,
        })
    }

    pub async fn rounds(&self, limit: usize) -> anyhow::Result<Vec<Round>> {
        let kvs = self.store.range(ROUNDS).await?;
        let from = kvs.len().saturating_sub(limit);
        Ok(kvs[from..]
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect())
    }

    /// Starts the role loop when it is configured: watches of the census and the spec that
    /// wake it, and the loop itself.
    pub fn start(self: &Arc<Self>, rt: &mut crate::runtime::Runtime) {
        let Some(cfg) = self.config.clone() else {
            return;
        };
        for prefix in [crate::census::HOSTS, crate::census::INSTANCES, SPEC_KEY] {
            let me = self.clone();
            rt.spawn_future("roles: watch", async move {
                me.follow(prefix).await;
                Ok(())
            });
        }
        let me = self.clone();
        rt.spawn_future("roles", async move {
            me.run(cfg).await;
            Ok(())
        });
    }

    /// The leader's loop: a round on every census or spec change (after `debounce`) and
    /// every `round_every`; nothing while this host does not lead.
    async fn run(self: Arc<Self>, cfg: RolesConfig) {
        loop {
            // A rollout under way is stepped every second: its batches wait on the
            // dominator's census, which wakes nothing here.
            let every = if self.rolling.load(std::sync::atomic::Ordering::Relaxed) {
                cfg.round_every.min(ROLLOUT_STEP)
            } else {
                cfg.round_every
            };
            tokio::select! {
                _ = self.wake.notified() => tokio::time::sleep(cfg.debounce).await,
                _ = tokio::time::sleep(every) => {}
            }
            let Some(leadership) = self.leader.borrow().clone() else {
                // Another host decides meanwhile: its counts are taken back from its rounds.
                self.memory.lock().unwrap_or_else(|e| e.into_inner()).scale = None;
                continue;
            };
            if let Err(e) = self.round(&cfg, leadership.fence()).await {
                tracing::warn!(error = %e, "roles: round failed");
            }
        }
    }

    /// Wakes the loop on every change under `prefix`.
    async fn follow(&self, prefix: &str) {
        loop {
            let mut w = match self.store.watch(prefix, 0).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, prefix, "roles: cannot watch; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            while let Some(ev) = w.next().await {
                if ev.is_err() {
                    break;
                }
                self.wake.notify_one();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One round: plan, run the actions in order (stopping at the first failure: the next
    /// round re-plans from what happened), keep the round.
    pub async fn round(&self, cfg: &RolesConfig, fence: Option<Compare>) -> anyhow::Result<()> {
        let started = Instant::now();
        let Some(stored) = self.stored_spec().await? else {
            return Ok(());
        };
        let spec = match Spec::parse(&stored.file, &stored.text) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "roles: the stored spec does not validate");
                return Ok(());
            }
        };
        let applied = paddock_clock::UnixMs(stored.applied_ms);
        let (census, uuids) = self.live_census().await?;
        let at_ms = unix_ms();
        let (mut plan, decisions, scale_before) = self.scale(&spec, &census, at_ms).await;
        // A new instance of a role being rolled starts on the version the rollout reached.
        let rollouts = crate::rollouts::load_all(self.store.as_ref()).await?;
        for a in &mut plan.actions {
            if let (Kind::Start, Some(image), Some(r)) =
                (a.kind, &mut a.image, rollouts.get(&a.role))
            {
                *image = r.rollout.version_for_new().to_string();
            }
        }
        // So does a hook role's: its hooks are given that version.
        let mut acting = spec.clone();
        for (name, r) in &rollouts {
            if let Some(role) = acting.roles.get_mut(name)
                && role.version.is_some()
            {
                role.version = Some(r.rollout.version_for_new().to_string());
            }
        }
        let shadows = self.shadows(&census, at_ms).await;
        let changed = {
            let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            m.last_round = Some(RoundStats {
                roles: plan
                    .roles
                    .iter()
                    .map(|(r, c)| (r.clone(), (c.current, c.target)))
                    .collect(),
                actions: plan.actions.len(),
                seconds: started.elapsed().as_secs_f64(),
            });
            let changed =
                m.last_outcome.as_ref() != Some(&plan.outcome) || m.last_shadows != shadows;
            m.last_outcome = Some(plan.outcome.clone());
            m.last_shadows = shadows.clone();
            changed
        };
        if !plan.actions.is_empty() || changed {
            let round = Round {
                at_ms,
                spec: stored,
                census,
                plan,
                results: Vec::new(),
                scale: decisions,
                scale_before,
                shadows,
            };
            self.carry_out(cfg, &acting, round, &uuids, fence.clone())
                .await?;
        }
        // After the plan (which counted the instances as they were): the rollouts' step.
        self.roll(cfg, &spec, applied, rollouts, &uuids, fence)
            .await
    }

    /// This round's count for each scaled role, and the history it started from. A new
    /// leader starts from the counts of the last round kept (not its history: the
    /// stabilisation window starts again, so nothing declines on a partial view).
    async fn scale(
        &self,
        spec: &Spec,
        census: &Census,
        at_ms: i64,
    ) -> (
        Plan,
        BTreeMap<String, paddock_roles::Decision>,
        BTreeMap<String, paddock_roles::ScaleState>,
    ) {
        let known = self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .scale
            .is_some();
        if !known {
            let last = self.rounds(1).await.ok().and_then(|mut r| r.pop());
            let restored = last
                .map(|r| {
                    r.scale
                        .into_iter()
                        .map(|(role, d)| {
                            let st = paddock_roles::ScaleState {
                                desired: Some(d.desired),
                                ..paddock_roles::ScaleState::default()
                            };
                            (role, st)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            m.scale.get_or_insert(restored);
        }
        let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let states = m.scale.get_or_insert_with(BTreeMap::new);
        let before = states.clone();
        let (plan, decisions) = paddock_roles::round_plan(spec, census, states, at_ms);
        (plan, decisions, before)
    }

    /// Every shadow spec planned for `census` at `at_ms`, each with its own scaled roles'
    /// history; a shadow that no longer validates is left out (and logged).
    async fn shadows(&self, census: &Census, at_ms: i64) -> BTreeMap<String, ShadowPlan> {
        let stored = match self.shadow_specs().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "roles: cannot read the shadow specs");
                return BTreeMap::new();
            }
        };
        let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        m.shadow_scale.retain(|name, _| stored.contains_key(name));
        let mut out = BTreeMap::new();
        for (name, s) in stored {
            let spec = match Spec::parse(&s.file, &s.text) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::warn!(shadow = %name, error = %e, "roles: a shadow spec does not validate");
                    continue;
                }
            };
            let states = m.shadow_scale.entry(name.clone()).or_default();
            let (plan, scale) = paddock_roles::round_plan(&spec, census, states, at_ms);
            out.insert(
                name,
                ShadowPlan {
                    file: s.file,
                    plan,
                    scale,
                },
            );
        }
        out
    }

    /// The last round, for `/metrics` (none before this host's first round as leader).
    pub fn round_stats(&self) -> Option<RoundStats> {
        if self.leader.borrow().is_none() {
            return None;
        }
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_round
            .clone()
    }

    /// The shadow specs, by name.
    pub async fn shadow_specs(&self) -> anyhow::Result<BTreeMap<String, StoredSpec>> {
        let mut out = BTreeMap::new();
        for kv in self.store.range(SHADOWS).await? {
            if let (Some(name), Ok(s)) = (kv.name_under(SHADOWS), serde_json::from_slice(&kv.value))
            {
                out.insert(name, s);
            }
        }
        Ok(out)
    }

    /// Validates and stores a shadow spec (a bad one changes nothing).
    pub async fn apply_shadow(&self, name: &str, file: &str, text: &str) -> Result<Spec, ApiError> {
        paddock_roles::check_word("shadow", name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let spec = Spec::parse(file, text).map_err(|e| spec_errors(&e))?;
        let stored = StoredSpec {
            file: file.to_string(),
            text: text.to_string(),
            applied_ms: unix_ms(),
            templates: BTreeMap::new(),
        };
        self.store
            .put(
                &format!("{SHADOWS}{name}"),
                serde_json::to_vec(&stored).map_err(internal)?,
            )
            .await
            .map_err(internal)?;
        self.wake.notify_one();
        Ok(spec)
    }

    /// Runs the plan's actions in order (stopping at the first failure: the next round
    /// re-plans from what happened) and keeps the round.
    async fn carry_out(
        &self,
        cfg: &RolesConfig,
        spec: &Spec,
        mut round: Round,
        uuids: &BTreeMap<String, uuid::Uuid>,
        fence: Option<Compare>,
    ) -> anyhow::Result<()> {
        if let Outcome::FailStop(reason) = &round.plan.outcome {
            tracing::error!(%reason, "roles: fail-stop: nothing is started or stopped");
        }
        let mut results = Vec::new();
        for action in &round.plan.actions {
            if self.leader.borrow().is_none() {
                break;
            }
            let r = self.execute(cfg, spec, action).await;
            self.remember(cfg, &r);
            let message = describe(&r);
            if let Some(uuid) = action.host.as_ref().and_then(|h| uuids.get(h)) {
                let _ = self
                    .census
                    .inspector
                    .event(Subject::Node(*uuid), "role", &message, !r.ok)
                    .await;
            }
            if r.ok {
                tracing::info!("roles: {message}");
            } else {
                tracing::warn!("roles: {message}");
            }
            let ok = r.ok;
            results.push(r);
            if !ok {
                break;
            }
        }
        round.results = results;
        self.keep(&round, fence).await
    }

    /// Each image role's rollout: started when the spec names an image its instances do
    /// not run, stepped against the dominator's census, its effects carried out, and kept
    /// (fenced, compare-and-swap: an operator's command in between wins, and the step is
    /// taken again next round).
    async fn roll(
        &self,
        cfg: &RolesConfig,
        spec: &Spec,
        applied: paddock_clock::UnixMs,
        mut rollouts: BTreeMap<String, crate::rollouts::Stored>,
        uuids: &BTreeMap<String, uuid::Uuid>,
        fence: Option<Compare>,
    ) -> anyhow::Result<()> {
        use paddock_rollout::{Effect, Rollout};
        let assigned = self.assigned().await?;
        // A hook role's rollout reads the versions and the registrations: read once per
        // round, and only when a role has a version to roll.
        let hook_roles = spec
            .roles
            .values()
            .any(|r| r.image.is_none() && r.version.is_some());
        let (versions, registered) = if hook_roles {
            (self.versions().await?, self.census.view().await?.instances)
        } else {
            (Vec::new(), Vec::new())
        };
        let subs = self.subs();
        let minimums = paddock_roles::minimums(spec).unwrap_or_default();
        let now = paddock_clock::now();
        let mut rolling = false;
        for (name, role) in &spec.roles {
            // What the spec wants, and the members the rollout moves: an image role's
            // machines, or a hook role's instances (with the machine each is on).
            let images: Vec<(&str, &ImageInstance)> = assigned
                .iter()
                .filter(|(r, _, _)| r == name)
                .map(|(_, id, a)| (id.as_str(), a))
                .collect();
            let hooked: Vec<(String, crate::rollouts::Versioned)> = versions
                .iter()
                .filter(|(r, _, _)| r == name)
                .map(|(_, id, v)| (id.clone(), v.clone()))
                .collect();
            let (wanted, running, instances) = match (&role.image, &role.version) {
                (Some(image), _) => {
                    let hosts: Vec<&str> = images.iter().map(|(_, a)| a.host.as_str()).collect();
                    let running: Vec<&str> = images.iter().map(|(_, a)| a.image.as_str()).collect();
                    (image, running, crate::rollouts::observe(&hosts, &subs))
                }
                (None, Some(version)) => {
                    let mine: Vec<_> = registered
                        .iter()
                        .filter(|e| e.role == *name)
                        .cloned()
                        .collect();
                    let running: Vec<&str> =
                        hooked.iter().map(|(_, v)| v.version.as_str()).collect();
                    (
                        version,
                        running,
                        crate::rollouts::observe_versions(&hooked, &mine),
                    )
                }
                (None, None) => continue,
            };
            let stored = rollouts.remove(name);
            let current = stored.as_ref().map(|s| &s.rollout);
            let (mut rollout, read) =
                match crate::rollouts::to_start(wanted, &running, current, applied) {
                    Some(from) => {
                        let text = format!("rollout of {name} from {from} to {wanted} started");
                        tracing::info!("roles: {text}");
                        let r = Rollout::start(name, &from, wanted, role.update.clone(), now);
                        (r, stored.map_or(0, |s| s.revision))
                    }
                    None => match stored {
                        Some(s) if !s.rollout.phase.ended() => (s.rollout, s.revision),
                        _ => continue,
                    },
                };
            let before = (read != 0).then(|| rollout.clone());
            // The machine a member is on, for its timeline.
            let machine = |key: &str| -> Option<String> {
                if role.image.is_some() {
                    return Some(key.to_string());
                }
                hooked
                    .iter()
                    .find(|(id, _)| id == key)
                    .and_then(|(_, v)| v.host.clone())
            };
            let min = u32::try_from(minimums.get(name).copied().unwrap_or(0)).unwrap_or(u32::MAX);
            for effect in rollout.step(now, &instances, min) {
                match effect {
                    Effect::Set { host, version } if role.image.is_some() => {
                        let on_host = images.iter().filter(|(_, a)| a.host == host);
                        if let Err(e) = self.set_version(name, on_host, &version).await {
                            tracing::warn!(role = %name, %host, error = %e, "rollout: not moved");
                        }
                    }
                    Effect::Set { host: id, version } => {
                        // Asked again every step until healthy: moved once.
                        let Some((_, record)) = hooked.iter().find(|(i, _)| *i == id) else {
                            continue;
                        };
                        if record.version == version {
                            continue;
                        }
                        let r = self.restart(cfg, spec, name, &id, record, &version).await;
                        let node = record.host.as_ref().and_then(|h| uuids.get(h));
                        for result in r {
                            let message = describe(&result);
                            if let Some(uuid) = node {
                                let _ = self
                                    .census
                                    .inspector
                                    .event(Subject::Node(*uuid), "role", &message, !result.ok)
                                    .await;
                            }
                            tracing::info!("roles: rollout: {message}");
                        }
                    }
                    Effect::Note { host, text } => {
                        tracing::info!(role = %name, host = ?host, "rollout: {text}");
                        let node = host
                            .as_deref()
                            .and_then(machine)
                            .and_then(|h| uuids.get(&h).copied());
                        if let Some(uuid) = node {
                            let text = format!("rollout of {name}: {text}");
                            let _ = self
                                .census
                                .inspector
                                .event(Subject::Node(uuid), "role", &text, false)
                                .await;
                        }
                    }
                }
            }
            rolling |= !rollout.phase.ended();
            if before.as_ref() == Some(&rollout) {
                continue;
            }
            let saved =
                crate::rollouts::save(self.store.as_ref(), &rollout, read, fence.clone(), now.0)
                    .await?;
            if !saved {
                tracing::info!(role = %name, "rollout: changed meanwhile (a command); next round");
            }
        }
        self.rolling
            .store(rolling, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The hook roles' instances and their versions: `(role, instance, version)`.
    async fn versions(&self) -> anyhow::Result<Vec<(String, String, crate::rollouts::Versioned)>> {
        let mut out = Vec::new();
        for kv in self.store.range(crate::rollouts::VERSIONS).await? {
            let Some((role, id)) = kv.key[crate::rollouts::VERSIONS.len()..].split_once('/') else {
                continue;
            };
            if let Ok(v) = serde_json::from_slice(&kv.value) {
                out.push((role.to_string(), id.to_string(), v));
            }
        }
        Ok(out)
    }

    /// Moves a hook role's instance to `version`: its stop hook given the version it runs,
    /// then its start hook given the new one (which records it). Until it registers again
    /// it counts as started, so the plan does not replace it meanwhile. The actions' results.
    async fn restart(
        &self,
        cfg: &RolesConfig,
        spec: &Spec,
        role: &str,
        id: &str,
        record: &crate::rollouts::Versioned,
        version: &str,
    ) -> Vec<ActionResult> {
        let on = |v: &str| {
            let mut s = spec.clone();
            if let Some(r) = s.roles.get_mut(role) {
                r.version = Some(v.to_string());
            }
            s
        };
        let action = |kind| Action {
            kind,
            role: role.to_string(),
            instance: id.to_string(),
            host: record.host.clone(),
            image: None,
            why: paddock_roles::Why::Rollout,
        };
        let stop = self
            .execute(cfg, &on(&record.version), &action(Kind::Stop))
            .await;
        if !stop.ok {
            return vec![stop];
        }
        let start = self.execute(cfg, &on(version), &action(Kind::Start)).await;
        self.remember(cfg, &start);
        vec![stop, start]
    }

    /// Moves the role's instance on `host` to `image`: the machine's required image, its
    /// instance record (so that the role loop keeps counting it), and a wait until the
    /// dominator has taken the change (so that the next plan does not see the instance on
    /// an image its machine is not required to run, and replace it).
    async fn set_version<'a>(
        &self,
        role: &str,
        on_host: impl Iterator<Item = &'a (&'a str, &'a ImageInstance)>,
        image: &str,
    ) -> anyhow::Result<()> {
        let mut host = None;
        for (id, a) in on_host.filter(|(_, a)| a.image != image) {
            crate::dominator::set_required_image(&self.dominator, &a.host, image)
                .await
                .map_err(|e| anyhow::anyhow!(e.message))?;
            let record = ImageInstance {
                host: a.host.clone(),
                image: image.to_string(),
            };
            self.store
                .put(
                    &format!("{IMAGES}{role}/{id}"),
                    serde_json::to_vec(&record)?,
                )
                .await?;
            host = Some(a.host.as_str());
        }
        let Some(host) = host else {
            return Ok(());
        };
        let deadline = Instant::now() + MDB_FOLLOWED;
        while Instant::now() < deadline {
            let taken = self
                .subs()
                .get(host)
                .is_none_or(|s| s.required_image.as_deref() == Some(image));
            if taken {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn remember(&self, cfg: &RolesConfig, r: &ActionResult) {
        let mut m = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let a = &r.action;
        if r.ok {
            m.pending.push(Pending {
                instance: Instance {
                    role: a.role.clone(),
                    id: a.instance.clone(),
                    host: a.host.clone(),
                },
                kind: a.kind,
                until: Instant::now() + cfg.register_grace,
            });
        } else if let (Kind::Start, Some(h)) = (a.kind, &a.host) {
            m.quarantine
                .insert(h.clone(), Instant::now() + cfg.quarantine);
        }
    }

    /// Stores the round (fenced) and deletes the oldest past [`ROUNDS_KEPT`].
    async fn keep(&self, round: &Round, fence: Option<Compare>) -> anyhow::Result<()> {
        let key = format!("{ROUNDS}{:013}", round.at_ms);
        let mut success = vec![Op::put(key, serde_json::to_vec(round)?)];
        let keys = self.store.range(ROUNDS).await?;
        let extra = (keys.len() + 1).saturating_sub(ROUNDS_KEPT);
        success.extend(keys.iter().take(extra).map(|kv| Op::delete(kv.key.clone())));
        let done = self
            .store
            .txn(Txn {
                compare: fence.into_iter().collect(),
                success,
                failure: vec![],
            })
            .await?;
        if !done.succeeded {
            tracing::warn!("roles: round not kept: this host no longer leads");
        }
        Ok(())
    }

    async fn execute(&self, cfg: &RolesConfig, spec: &Spec, action: &Action) -> ActionResult {
        let started = Instant::now();
        let mut r = ActionResult {
            action: action.clone(),
            argv: None,
            ok: false,
            exit: None,
            stdout: String::new(),
            stderr: String::new(),
            error: None,
            ms: 0,
        };
        let outcome = self.execute_inner(cfg, spec, action, &mut r).await;
        if let Err(e) = outcome {
            r.error = Some(e.to_string());
        } else {
            r.ok = true;
        }
        r.ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        r
    }

    async fn execute_inner(
        &self,
        cfg: &RolesConfig,
        spec: &Spec,
        action: &Action,
        r: &mut ActionResult,
    ) -> Result<(), ActionError> {
        let started_ms = unix_ms();
        let key = format!("{IMAGES}{}/{}", action.role, action.instance);
        if let (Kind::Start, Some(image)) = (action.kind, &action.image) {
            let host = action.host.as_deref().ok_or(ActionError::NoHost)?;
            crate::dominator::set_required_image(&self.dominator, host, image)
                .await
                .map_err(|e| ActionError::RequiredImage {
                    host: host.to_string(),
                    image: image.clone(),
                    message: e.message,
                })?;
            let a = ImageInstance {
                host: host.to_string(),
                image: image.clone(),
            };
            let value = serde_json::to_vec(&a).unwrap_or_default();
            self.store
                .put(&key, value)
                .await
                .map_err(|source| ActionError::Record {
                    key: key.clone(),
                    source,
                })?;
        }
        if action.kind == Kind::Stop
            && spec
                .roles
                .get(&action.role)
                .is_some_and(|r| r.image.is_some())
        {
            self.store
                .delete(&key)
                .await
                .map_err(|source| ActionError::Record {
                    key: key.clone(),
                    source,
                })?;
        }
        let versioned = spec.roles.get(&action.role).and_then(|r| r.version.clone());
        let version_key = format!(
            "{}{}/{}",
            crate::rollouts::VERSIONS,
            action.role,
            action.instance
        );
        let Some(argv) = action.command(spec)? else {
            return Ok(());
        };
        r.argv = Some(argv.clone());
        let call = HookCall {
            role: &action.role,
            instance: &action.instance,
            action: action.kind.as_str(),
            host: action.host.as_deref(),
            input: None,
        };
        let out = run_hook(cfg, &self.public_url, &call, &argv).await?;
        r.exit = out.exit;
        r.stdout = out.stdout;
        r.stderr = out.stderr;
        match out.exit {
            Some(0) => {}
            Some(code) => return Err(ActionError::Exit(code)),
            None => return Err(ActionError::Signal),
        }
        // A hook role's instance is recorded on its version once started (its registration
        // from then on is that version's), and forgotten once stopped.
        let done = match (action.kind, versioned) {
            (Kind::Start, Some(version)) => {
                let record = crate::rollouts::Versioned {
                    version,
                    host: action.host.clone(),
                    since_ms: started_ms,
                };
                let value = serde_json::to_vec(&record).unwrap_or_default();
                self.store.put(&version_key, value).await.map(|_| ())
            }
            (Kind::Stop, Some(_)) => self.store.delete(&version_key).await.map(|_| ()),
            (_, None) => Ok(()),
        };
        done.map_err(|source| ActionError::Record {
            key: version_key,
            source,
        })
    }
}

/// What a hook run gave.
pub struct HookRun {
    pub exit: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// What a hook is run for: its environment's `PADDOCK_ROLE`, `PADDOCK_INSTANCE`,
/// `PADDOCK_ACTION` (`start`, `stop`, `disrupt`) and `PADDOCK_HOST`, and its stdin
/// (empty unless given).
pub struct HookCall<'a> {
    pub role: &'a str,
    pub instance: &'a str,
    pub action: &'a str,
    pub host: Option<&'a str>,
    pub input: Option<&'a [u8]>,
}

/// Runs `argv` (its first word relative to the hooks directory) without a shell, with only
/// the documented environment, for at most `hook_timeout`; a hook still running then is
/// killed with its process group.
pub async fn run_hook(
    cfg: &RolesConfig,
    public_url: &str,
    call: &HookCall<'_>,
    argv: &[String],
) -> Result<HookRun, ActionError> {
    let (first, args) = argv.split_first().ok_or(ActionError::EmptyCommand)?;
    let _ = std::fs::create_dir_all(&cfg.state_dir);
    let me = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "paddock".into());
    let mut env: Vec<(&str, String)> = vec![
        ("PADDOCK_URL", public_url.to_string()),
        ("PADDOCK_ROLE", call.role.to_string()),
        ("PADDOCK_INSTANCE", call.instance.to_string()),
        ("PADDOCK_ACTION", call.action.to_string()),
        ("PADDOCK_HOOK_STATE", cfg.state_dir.display().to_string()),
        ("PADDOCK_BIN", me),
    ];
    if let Some(h) = call.host {
        env.push(("PADDOCK_HOST", h.to_string()));
    }
    let program = Program {
        path: &cfg.hooks_dir.join(first),
        args,
        env: &env,
        dir: &cfg.hooks_dir,
        input: call.input,
        timeout: cfg.hook_timeout,
        stdout_kept: OUTPUT_TAIL,
    };
    run_program(&program).await
}

/// A program run for the appliance: no shell, `PATH` and `LC_ALL` plus `env` only.
pub struct Program<'a> {
    pub path: &'a std::path::Path,
    pub args: &'a [String],
    pub env: &'a [(&'a str, String)],
    pub dir: &'a std::path::Path,
    /// Written to its stdin (else stdin is empty).
    pub input: Option<&'a [u8]>,
    pub timeout: Duration,
    /// Bytes of its stdout kept (the tail; stderr keeps [`OUTPUT_TAIL`]).
    pub stdout_kept: usize,
}

/// Runs `p` for at most its timeout; one still running then is killed with its process
/// group. The tails of its stdout and stderr are kept.
pub async fn run_program(p: &Program<'_>) -> Result<HookRun, ActionError> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(p.path);
    cmd.args(p.args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .envs(p.env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(p.dir)
        .stdin(if p.input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| ActionError::Spawn {
        program: p.path.to_path_buf(),
        source,
    })?;
    let pid = child.id();
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let read = async {
        let fi = async {
            if let (Some(s), Some(bytes)) = (stdin.as_mut(), p.input) {
                // A program that reads none of it is not an error.
                let _ = s.write_all(bytes).await;
            }
            drop(stdin.take());
        };
        // Only the tails are kept while reading: a program that prints without end costs
        // no more memory than they hold, until its timeout.
        let ((), o, e) = tokio::join!(
            fi,
            read_tail(stdout.as_mut(), p.stdout_kept),
            read_tail(stderr.as_mut(), OUTPUT_TAIL)
        );
        let status = child.wait().await;
        (o, e, status)
    };
    match tokio::time::timeout(p.timeout, read).await {
        Ok((o, e, status)) => Ok(HookRun {
            exit: status.map_err(ActionError::Wait)?.code(),
            stdout: String::from_utf8_lossy(&o).into_owned(),
            stderr: tail(&e),
        }),
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(ActionError::Timeout(p.timeout))
        }
    }
}

/// The last `keep` bytes `from` gives until its end (or a read error), holding at most
/// twice that while reading.
async fn read_tail<R>(from: Option<&mut R>, keep: usize) -> Vec<u8>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut kept = Vec::new();
    let Some(from) = from else {
        return kept;
    };
    let mut chunk = vec![0; 64 << 10];
    while let Ok(n) = from.read(&mut chunk).await
        && n > 0
    {
        kept.extend_from_slice(&chunk[..n]);
        if kept.len() > keep.saturating_mul(2).max(chunk.len()) {
            kept.drain(..kept.len() - keep);
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}

/// One line for the log and the host's timeline.
pub fn describe(r: &ActionResult) -> String {
    let a = &r.action;
    let result = if r.ok {
        "ok".to_string()
    } else {
        format!("failed: {}", r.error.as_deref().unwrap_or("?"))
    };
    let mut line = format!("{} ({:?}): {result}", a.label(), a.why);
    let err = r.stderr.trim();
    if !r.ok && !err.is_empty() {
        line.push_str(&format!("; stderr: {}", err.lines().last().unwrap_or("")));
    }
    line
}

pub fn router(roles: Arc<Roles>) -> Router {
    Router::new()
        .route("/api/v1/spec", get(show).post(apply))
        .route("/api/v1/spec/plan", post(preview))
        .route("/api/v1/spec/rounds", get(rounds))
        .route("/api/v1/spec/replay/{at_ms}", post(replay))
        .route("/api/v1/spec/shadow", get(list_shadows))
        .route(
            "/api/v1/spec/shadow/{name}",
            post(apply_shadow).delete(remove_shadow),
        )
        .with_state(roles)
}

async fn show(State(r): State<Arc<Roles>>) -> Result<Json<StoredSpec>, ApiError> {
    r.stored_spec()
        .await
        .map_err(internal)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no spec applied yet: paddock spec apply FILE"))
}

#[derive(Serialize, Deserialize)]
pub struct Applied {
    pub file: String,
    pub roles: Vec<String>,
}

async fn apply(
    State(r): State<Arc<Roles>>,
    Json(body): Json<SpecBody>,
) -> Result<Json<Applied>, ApiError> {
    let (Some(file), Some(text)) = (body.file, body.text) else {
        return Err(ApiError::bad_request("send {\"file\", \"text\"}"));
    };
    let spec = r.apply(&file, &text, &body.templates).await?;
    Ok(Json(Applied {
        file,
        roles: spec.roles.keys().cloned().collect(),
    }))
}

async fn preview(
    State(r): State<Arc<Roles>>,
    Json(body): Json<SpecBody>,
) -> Result<Json<PlanPreview>, ApiError> {
    Ok(Json(r.preview(&body).await?))
}

async fn list_shadows(
    State(r): State<Arc<Roles>>,
) -> Result<Json<BTreeMap<String, StoredSpec>>, ApiError> {
    Ok(Json(r.shadow_specs().await.map_err(internal)?))
}

async fn apply_shadow(
    State(r): State<Arc<Roles>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    Json(body): Json<SpecBody>,
) -> Result<Json<Applied>, ApiError> {
    let (Some(file), Some(text)) = (body.file, body.text) else {
        return Err(ApiError::bad_request("send {\"file\", \"text\"}"));
    };
    let spec = r.apply_shadow(&name, &file, &text).await?;
    Ok(Json(Applied {
        file,
        roles: spec.roles.keys().cloned().collect(),
    }))
}

async fn remove_shadow(
    State(r): State<Arc<Roles>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let gone = r
        .store
        .delete(&format!("{SHADOWS}{name}"))
        .await
        .map_err(internal)?;
    r.wake.notify_one();
    Ok(Json(serde_json::json!({ "removed": gone })))
}

async fn replay(
    State(r): State<Arc<Roles>>,
    axum::extract::Path(at_ms): axum::extract::Path<i64>,
    Json(body): Json<SpecBody>,
) -> Result<Json<Replayed>, ApiError> {
    Ok(Json(r.replay(at_ms, &body).await?))
}

async fn rounds(
    State(r): State<Arc<Roles>>,
    Query(q): Query<paddock_wire::Limit>,
) -> Result<Json<Vec<Round>>, ApiError> {
    Ok(Json(
        r.rounds(q.or(20, ROUNDS_KEPT)).await.map_err(internal)?,
    ))
}

/// `[roles]` (the role loop runs only with a `hooks_dir`). Seconds unless named.
pub const ROLES_HOOK_TIMEOUT_SECS: u64 = 60;
pub const ROLES_ROUND_SECS: u64 = 30;
pub const ROLES_DEBOUNCE_MS: u64 = 500;
pub const ROLES_QUARANTINE_SECS: u64 = 60;
pub const ROLES_REGISTER_GRACE_SECS: u64 = 15;

/// A plan as the CLI prints it: the outcome, then one line per action with its command.
pub fn plan_text(plan: &Plan, commands: &[Option<Vec<String>>]) -> String {
    let mut out = match &plan.outcome {
        Outcome::Optimal => "outcome: optimal (every root at its max)\n".to_string(),
        Outcome::Viable => "outcome: viable (some root could grow with more hosts)\n".to_string(),
        Outcome::FailStop(r) => format!("outcome: FAIL-STOP, nothing will run: {r}\n"),
    };
    out.push_str("role                 current  minimum  max      target\n");
    for (role, c) in &plan.roles {
        let max = c.max.map_or("-".to_string(), |m| m.to_string());
        out.push_str(&format!(
            "{role:<20} {:<8} {:<8} {max:<8} {}\n",
            c.current, c.minimum, c.target
        ));
    }
    if plan.actions.is_empty() {
        out.push_str("no actions\n");
    }
    for (i, a) in plan.actions.iter().enumerate() {
        let image = a
            .image
            .as_deref()
            .map(|m| format!(", image {m}"))
            .unwrap_or_default();
        let cmd = match commands.get(i).cloned().flatten() {
            Some(argv) => argv.join(" "),
            None => "(no hook)".into(),
        };
        out.push_str(&format!(
            "{:>3}. {} ({:?}{image}): {cmd}\n",
            i + 1,
            a.label(),
            a.why
        ));
    }
    for n in &plan.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// Why an action of a round failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("an image role's instance has no host")]
    NoHost,
    #[error("setting {host}'s required image to {image}: {message}")]
    RequiredImage {
        host: String,
        image: String,
        message: String,
    },
    #[error("recording {key}: {source}")]
    Record {
        key: String,
        source: paddock_store::StoreError,
    },
    #[error(transparent)]
    Command(#[from] paddock_roles::CommandError),
    #[error("an empty command line")]
    EmptyCommand,
    #[error("cannot run {}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("waiting for the hook: {0}")]
    Wait(std::io::Error),
    #[error("the hook ran longer than {} s and was killed", .0.as_secs())]
    Timeout(Duration),
    #[error("the hook exited with status {0}")]
    Exit(i32),
    #[error("the hook was killed by a signal")]
    Signal,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten megabytes read for a tail of a hundred: the tail is right, and what was held
    /// while reading stayed near the chunk's size, not the output's.
    #[tokio::test]
    async fn only_the_tail_of_an_output_is_held() {
        let mut ten_mb = tokio::io::AsyncReadExt::chain(
            tokio::io::AsyncReadExt::take(tokio::io::repeat(b'x'), 10 << 20),
            &b"the end"[..],
        );
        let kept = read_tail(Some(&mut ten_mb), 100).await;
        assert_eq!(kept.len(), 100);
        assert!(kept.ends_with(b"xxxthe end"));
        assert!(kept.capacity() <= 512 << 10, "{}", kept.capacity());
        let mut short = &b"short"[..];
        assert_eq!(read_tail(Some(&mut short), 100).await, b"short");
        assert!(read_tail(None::<&mut &[u8]>, 100).await.is_empty());
    }

    fn cfg(dir: &std::path::Path, timeout: u64) -> RolesConfig {
        RolesConfig {
            hooks_dir: dir.to_path_buf(),
            hook_timeout: Duration::from_secs(timeout),
            round_every: Duration::from_secs(30),
            debounce: Duration::from_millis(500),
            quarantine: Duration::from_secs(60),
            register_grace: Duration::from_secs(15),
            state_dir: dir.join("state"),
        }
    }

    fn action(host: &str) -> HookCall<'_> {
        HookCall {
            role: "db",
            instance: "db-1",
            action: "start",
            host: Some(host),
            input: None,
        }
    }

    fn hook(dir: &std::path::Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[tokio::test]
    async fn hooks_get_words_not_shell_text_and_a_fixed_environment() {
        let dir = tempfile::tempdir().unwrap();
        hook(
            dir.path(),
            "echo.sh",
            r#"for a in "$@"; do printf '[%s]' "$a"; done; echo; echo "$PADDOCK_URL $PADDOCK_ROLE $PADDOCK_INSTANCE $PADDOCK_HOST $PADDOCK_ACTION ${HOME:-nohome}"; echo oops >&2; exit 3"#,
        );
        let argv: Vec<String> = ["echo.sh", "-h", "$(touch pwned); x y", "-i", "db-1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let run = run_hook(
            &cfg(dir.path(), 10),
            "http://198.18.0.1:8080",
            &action("h1"),
            &argv,
        )
        .await
        .unwrap();
        assert_eq!(run.exit, Some(3));
        assert_eq!(
            run.stdout,
            "[-h][$(touch pwned); x y][-i][db-1]\nhttp://198.18.0.1:8080 db db-1 h1 start nohome\n"
        );
        assert_eq!(run.stderr, "oops\n");
        assert!(!dir.path().join("pwned").exists());
    }

    #[tokio::test]
    async fn a_hook_past_its_timeout_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        hook(dir.path(), "slow.sh", "sleep 30 & sleep 30");
        let t = Instant::now();
        let argv = vec!["slow.sh".to_string()];
        let e = run_hook(&cfg(dir.path(), 1), "http://x", &action("h1"), &argv)
            .await
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "the hook ran longer than 1 s and was killed");
        assert!(t.elapsed() < Duration::from_secs(10));
        let missing = run_hook(
            &cfg(dir.path(), 1),
            "http://x",
            &action("h1"),
            &["nope.sh".to_string()],
        )
        .await
        .err()
        .unwrap();
        assert!(missing.to_string().starts_with("cannot run "), "{missing}");
    }

    #[test]
    fn image_role_instances_count_while_their_sub_is_on_the_way_or_synced() {
        use paddock_dominator::{SubState, SubStatus};
        let sub = |host: &str, image: &str, state: SubState| {
            (
                host.to_string(),
                SubStatus {
                    hostname: host.into(),
                    address: "198.18.0.9:6969".into(),
                    required_image: Some(image.into()),
                    state,
                    summary: String::new(),
                    failures: 0,
                    health: None,
                    fetch: None,
                    since_ms: 0,
                },
            )
        };
        let subs: BTreeMap<String, SubStatus> = [
            sub(
                "h1",
                "mirror",
                SubState::Synced {
                    image: "mirror".into(),
                },
            ),
            sub("h2", "mirror", SubState::Updating),
            sub(
                "h3",
                "mirror",
                SubState::Unreachable {
                    error: "down".into(),
                },
            ),
            sub(
                "h4",
                "worker",
                SubState::Synced {
                    image: "worker".into(),
                },
            ),
            sub(
                "h5",
                "mirror",
                SubState::Synced {
                    image: "old".into(),
                },
            ),
        ]
        .into();
        let assigned: Vec<(String, String, ImageInstance)> = ["h1", "h2", "h3", "h4", "h5", "h6"]
            .iter()
            .enumerate()
            .map(|(i, h)| {
                (
                    "mirror".to_string(),
                    format!("mirror-{}", i + 1),
                    ImageInstance {
                        host: h.to_string(),
                        image: "mirror".into(),
                    },
                )
            })
            .collect();
        let alive: Vec<String> = image_instances(&assigned, &subs)
            .into_iter()
            .map(|i| format!("{} on {}", i.id, i.host.unwrap()))
            .collect();
        // h3 is unreachable, h4's required image is another, h5 is synced to another, h6 is
        // not a sub.
        assert_eq!(alive, vec!["mirror-1 on h1", "mirror-2 on h2"]);
        // Every installed machine the dominator reaches is a live host, whatever its image.
        let hosts: Vec<String> = live_sub_hosts(&subs).into_iter().collect();
        assert_eq!(hosts, vec!["h1", "h2", "h4", "h5"]);
    }

    #[test]
    fn the_roles_section_is_validated() {
        let mut p = Vec::new();
        assert!(validate(&RolesFile::default(), std::path::Path::new("/d"), &mut p).is_none());
        let f = RolesFile {
            hooks_dir: Some("hooks".into()),
            round_secs: Some(0),
            ..RolesFile::default()
        };
        let c = validate(&f, std::path::Path::new("/d"), &mut p).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/d/hooks"));
        assert_eq!(
            p,
            vec![
                "roles.hooks_dir: hooks must be an absolute path",
                "roles.round_secs: 0 must be 1 to 3600"
            ]
        );
    }
}
