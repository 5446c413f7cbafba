//! The herd (Dominator's `dom/herd`): the shell that drives one [`Sub`] state machine per
//! machine of the MDB. One task owns every state machine; the RPCs they ask for run as
//! separate tasks, bounded by poll and update slots, and report back over a channel, so a
//! slow or dead sub never holds up another.
//!
//! Memory: a sub's tree is held only between the poll that brought it and the plan that
//! uses it, and it holds one of a few tree slots (four per CPU) from before its answer is
//! read until it is planned, so the trees in memory stay few however many polls run and
//! however far planning falls behind (each is a few MB read, decoded and planned; many at
//! once only grow the allocator's heap, which keeps what it grew to). Plans do not wait
//! for poll slots: they run as soon as their tree is in, as many at a time as there are
//! CPUs. A synced sub keeps its state machine, its spec and, until sent, the objects to
//! clean up or preload. Images are fetched once per name ([`ImageSource`] is asked once,
//! concurrent plans wait for that one answer) and prepared once ([`PreparedImage`]),
//! shared by every sub on them.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use paddock_image::{FileSystem, Image, ObjectId, UpdateRequest};
use paddock_subd_proto::{
    FetchReply, FetchRequest, FetchStats, PollRequest, PollResponse, UpdateReport,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::compute::{Computed, PreparedImage, compute};
use crate::sub::{
    Action, Desired, Disruption, Event, PlanSummary, Policy, PollAnswer, Sub, SubState,
};

/// A failed RPC, as the sub's state will show it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RpcError(pub String);

/// A poll's answer, with the tree slot its tree holds (see [`SubRpc::poll_gated`]).
pub struct Polled {
    pub answer: PollResponse,
    /// Taken when a tree came; held until the tree is planned.
    pub tree_slot: Option<OwnedSemaphorePermit>,
}

/// subd's RPC, as the herd uses it (HTTP in the appliance; a simulator in tests and the
/// bench).
#[async_trait]
pub trait SubRpc: Send + Sync + 'static {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError>;

    /// [`SubRpc::poll`], where an answer that brings a tree takes a slot of `trees` first:
    /// an implementation that can tell a tree is coming before reading it (an HTTP answer's
    /// length) waits for the slot before reading, so trees read and decoded but not yet
    /// planned stay within `trees` however many polls run. This one polls, then waits.
    async fn poll_gated(
        &self,
        address: &str,
        req: PollRequest,
        trees: &Arc<Semaphore>,
    ) -> Result<Polled, RpcError> {
        let answer = self.poll(address, req).await?;
        let tree_slot = match answer.file_system {
            Some(_) => trees.clone().acquire_owned().await.ok(),
            None => None,
        };
        Ok(Polled { answer, tree_slot })
    }

    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<FetchReply, RpcError>;
    /// subd's report: the change window, the triggers run and their results, errors.
    async fn update(&self, address: &str, req: UpdateRequest) -> Result<UpdateReport, RpcError>;
    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError>;
}

/// Where images come from (the image server's index in the appliance).
#[async_trait]
pub trait ImageSource: Send + Sync + 'static {
    /// `Ok(None)`: no such image.
    async fn image(&self, name: &str) -> Result<Option<Arc<Image>>, RpcError>;
}

/// What the disruption check is asked about one sub: an update that runs a high-impact or
/// reboot trigger (Dominator's disruption manager).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisruptionQuery {
    pub hostname: String,
    /// `host:port` of its subd.
    pub address: String,
    /// The image the update brings.
    pub image: String,
    /// The services whose triggers the update runs.
    pub services: Vec<String>,
    /// A trigger reboots the machine.
    pub reboot: bool,
    /// A trigger is marked high-impact.
    pub high_impact: bool,
}

/// Whether a machine may be disrupted now. An answer that cannot be had is a denial (with
/// the reason): the sub asks again later.
#[async_trait]
pub trait DisruptionCheck: Send + Sync + 'static {
    async fn ask(&self, query: DisruptionQuery) -> Disruption;
}

/// Trees read but not yet planned, per CPU (see the module's note on memory).
const TREES_PER_CPU: usize = 4;

/// One machine the herd keeps: where its subd answers and what is wanted of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubSpec {
    pub hostname: String,
    /// `host:port` of its subd.
    pub address: String,
    pub desired: Desired,
    /// Raised by an operator clearing the safety hold (`paddock sub clear-safety`): a
    /// higher number than the herd last saw clears the hold once.
    pub safety_clearance: u64,
}

/// How hard the herd may push.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Polls (and plans) at once.
    pub poll_slots: usize,
    /// Fetches, updates and cleanups at once.
    pub update_slots: usize,
    /// The image server subs fetch from (`host:port` or a URL).
    pub image_server: String,
    /// Share of a sub's link a fetch may use.
    pub fetch_speed_percent: f64,
    /// Share of the subs that may run an update with a high-impact or reboot trigger at
    /// once (at least one: [`high_impact_limit`]).
    pub high_impact_share: f64,
}

/// How many updates with a high-impact or reboot trigger may run at once among `subs`:
/// `max(1, floor(share × subs))`.
pub fn high_impact_limit(share: f64, subs: usize) -> usize {
    let n = (share * subs as f64).floor();
    if n.is_finite() && n >= 1.0 {
        n as usize
    } else {
        1
    }
}

/// Whether a queued fetch, update or cleanup may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Start,
    /// Every update slot is taken.
    NoSlot,
    /// A high-impact update, and `high_limit` of them run already; ordinary work behind
    /// it is not held.
    HighImpactShare,
}

/// The admission rule: a slot of `update_slots` for everything, and for an update that
/// runs a high-impact or reboot trigger also fewer than `high_limit` such updates running.
pub fn admit(
    high_impact: bool,
    running: usize,
    running_high_impact: usize,
    update_slots: usize,
    high_limit: usize,
) -> Admission {
    if running >= update_slots.max(1) {
        Admission::NoSlot
    } else if high_impact && running_high_impact >= high_limit.max(1) {
        Admission::HighImpactShare
    } else {
        Admission::Start
    }
}

/// What one cycle of changes did on a sub, for its timeline: the plan, what was fetched
/// and subd's update report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangeReport {
    /// The first plan of the cycle (what it set out to do).
    pub plan: Option<PlanSummary>,
    /// The disruption check's permission, and how long it was denied before.
    pub disruption: Option<String>,
    /// The fetches of the cycle, added up.
    pub fetched: Option<FetchStats>,
    pub update: Option<UpdateReport>,
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

impl ChangeReport {
    /// "updated to minbase2: 343 objects (15.6 MB) fetched in 1.2 s, change window 22 ms,
    /// triggers: ssh.service restart ok".
    pub fn describe(&self) -> String {
        let image = self
            .update
            .as_ref()
            .map(|u| u.image_name.clone())
            .or_else(|| self.plan.as_ref().map(|p| p.image.clone()))
            .unwrap_or_default();
        let mut parts: Vec<String> = Vec::new();
        if let Some(p) = &self.plan {
            parts.push(format!(
                "plan: {} objects to fetch ({}), {} deletions, {} → {} inodes",
                p.objects_to_fetch,
                mb(p.fetch_bytes),
                p.deletions,
                p.sub_inodes,
                p.image_inodes
            ));
        }
        if let Some(d) = &self.disruption {
            parts.push(d.clone());
        }
        match &self.fetched {
            Some(f) => parts.push(format!(
                "{} objects ({}) fetched in {:.1} s",
                f.objects,
                mb(f.bytes),
                f.seconds
            )),
            None => parts.push("nothing fetched".into()),
        }
        if let Some(u) = &self.update {
            parts.push(format!("change window {:.0} ms", u.apply.change_window_ms));
            let runs: Vec<String> = u
                .trigger_runs
                .iter()
                .map(|r| {
                    let result = if r.ok {
                        "ok".to_string()
                    } else {
                        match r.exit_code {
                            Some(c) => format!("failed (exit {c})"),
                            None => format!("failed ({})", r.output.lines().next().unwrap_or("")),
                        }
                    };
                    format!("{} {result}", r.command)
                })
                .collect();
            if runs.is_empty() {
                parts.push("no triggers".into());
            } else {
                parts.push(format!("triggers: {}", runs.join(", ")));
            }
            if u.rebooting {
                parts.push("rebooting".into());
            }
            let mut errors: Vec<&str> = u.apply.errors.iter().map(String::as_str).collect();
            if let Some(e) = &u.error
                && !errors.contains(&e.as_str())
            {
                errors.push(e);
            }
            if !errors.is_empty() {
                parts.push(format!("errors: {}", errors.join("; ")));
            }
        }
        if self.update.is_some() {
            format!("updated to {image}: {}", parts.join(", "))
        } else {
            format!("not updated to {image}: {}", parts.join(", "))
        }
    }
}

/// A change of a sub's state, for the machine's timeline; with the cycle's report when
/// the change ends one (the sub proved synced, or in error).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub hostname: String,
    pub state: SubState,
    pub report: Option<Box<ChangeReport>>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            poll_slots: 200,
            update_slots: 2,
            image_server: String::new(),
            fetch_speed_percent: 10.0,
            high_impact_share: 0.1,
        }
    }
}

/// What the herd shows of one sub.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubStatus {
    pub hostname: String,
    pub address: String,
    pub required_image: Option<String>,
    #[serde(flatten)]
    pub state: SubState,
    /// The state as an operator reads it.
    pub summary: String,
    pub failures: u32,
    /// The sub's health check after its last update, as its last poll reported it (none:
    /// no check configured, or no update yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<SubHealth>,
    /// The fetch under way, as the sub's short polls during it report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<FetchProgress>,
    /// When the sub entered the state it is in, as the leading dominator saw it (Unix ms;
    /// a new leader starts counting afresh): since when it has been synced, unreachable,
    /// fetching. The brief steps of polling and computing do not count as a change, so a
    /// sub retried while unreachable, or re-planned while synced, keeps its time.
    #[serde(default)]
    pub since_ms: i64,
}

/// A fetch under way on a sub: what the plan sends and what the sub has written so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// When the fetch was sent, and when `bytes_done` was read (the herd's monotonic clock,
    /// ms: only the difference means anything).
    pub started_ms: u64,
    pub at_ms: u64,
    /// The fetch ended well: every object is on the sub, the update is next. Kept until the
    /// cycle ends (synced or failed), so its progress does not go back meanwhile.
    #[serde(default)]
    pub done: bool,
}

/// How often a sub whose fetch runs is short-polled for the bytes written so far.
const PROGRESS_EVERY_MS: u64 = 1000;

/// A sub's health check after an update: what a rollout waits for besides the sync.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubHealth {
    /// The image the update applied.
    pub image: String,
    pub passed: bool,
    /// When it ran (the sub's clock, Unix ms).
    pub at_ms: i64,
}

/// What a finished RPC brought back.
enum Outcome {
    /// The answer, and the tree slot when a tree came with it.
    Polled(
        Result<Box<PollResponse>, RpcError>,
        Option<OwnedSemaphorePermit>,
    ),
    Planned(Result<Option<Box<Computed>>, RpcError>),
    Fetched(Result<FetchReply, RpcError>),
    Updated(Result<Box<UpdateReport>, RpcError>),
    CleanedUp(Result<(), RpcError>),
    Asked(Disruption),
    /// The sub's computed files cannot be laid over its image.
    ComputedMissing(String),
}

struct Slot {
    spec: SubSpec,
    sub: Sub,
    /// What the last plan said to send, until sent (the update, the objects to fetch,
    /// preload or clean up); none for a synced sub with nothing to send.
    computed: Option<Box<Computed>>,
    /// A fetch, update or cleanup waiting for its slot (and whether it is an update with
    /// a high-impact or reboot trigger).
    queued: Option<(Action, bool)>,
    /// What this cycle changed, until the cycle ends (for the timeline).
    report: Option<Box<ChangeReport>>,
    /// The health check its last poll reported.
    health: Option<SubHealth>,
    /// When the disruption check first denied the update it waits for.
    denied_since_ms: Option<u64>,
    /// The fetch under way (not a preload), and when it is next short-polled for progress
    /// (`None`: a progress poll is out).
    fetch: Option<FetchProgress>,
    progress_at_ms: Option<u64>,
    /// When the sub entered the state it shows (wall clock, Unix ms), and that state's
    /// name ([`SubStatus::since_ms`]).
    since_ms: i64,
    since_state: &'static str,
}

/// A tree a poll brought, on its way to its plan, with its tree slot.
struct Tree {
    fs: FileSystem,
    cache: BTreeSet<ObjectId>,
    free_bytes: Option<u64>,
    _slot: Option<OwnedSemaphorePermit>,
}

/// Images by name, each fetched and prepared once and shared by every plan against it
/// (images are immutable: a name is used once). A missing image or a failure is not
/// remembered: the next plan asks again.
#[derive(Default)]
struct Images {
    cells: Mutex<HashMap<String, Arc<OnceCell<Arc<PreparedImage>>>>>,
}

impl Images {
    /// `Err(None)`: no such image.
    async fn get<I: ImageSource>(
        &self,
        name: &str,
        source: &I,
    ) -> Result<Arc<PreparedImage>, Option<RpcError>> {
        let cell = self
            .cells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone();
        cell.get_or_try_init(|| async {
            match source.image(name).await {
                Ok(Some(image)) => tokio::task::spawn_blocking(move || PreparedImage::new(image))
                    .await
                    .map(Arc::new)
                    .map_err(|e| Some(RpcError(format!("preparing image {name}: {e}")))),
                Ok(None) => Err(None),
                Err(e) => Err(Some(e)),
            }
        })
        .await
        .cloned()
    }

    /// Forgets every image no sub wants.
    fn retain(&self, wanted: &BTreeSet<String>) {
        self.cells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|name, _| wanted.contains(name));
    }
}

/// What the RPC and plan tasks share with the herd's loop.
struct Tasks {
    polls: Arc<Semaphore>,
    trees: Arc<Semaphore>,
    plans: Arc<Semaphore>,
    images: Arc<Images>,
    tx: mpsc::UnboundedSender<(String, Outcome)>,
    /// The bytes a running fetch has written, from a short poll during it: beside the state
    /// machine, which it does not concern.
    progress: mpsc::UnboundedSender<(String, Result<u64, RpcError>)>,
}

/// The herd's shared view, for the API and metrics.
pub type Census = Arc<std::sync::RwLock<BTreeMap<String, SubStatus>>>;

pub struct Herd<R: SubRpc, I: ImageSource> {
    rpc: Arc<R>,
    images: Arc<I>,
    policy: Policy,
    limits: Limits,
    census: Census,
    changes: Option<mpsc::UnboundedSender<Change>>,
    disruption: Option<Arc<dyn DisruptionCheck>>,
}

impl<R: SubRpc, I: ImageSource> Herd<R, I> {
    /// A herd that publishes what it sees in `census` (kept across leaderships).
    pub fn new(
        rpc: Arc<R>,
        images: Arc<I>,
        policy: Policy,
        limits: Limits,
        census: Census,
    ) -> Self {
        Herd {
            rpc,
            images,
            policy,
            limits,
            census,
            changes: None,
            disruption: None,
        }
    }

    /// Updates that run a high-impact or reboot trigger ask `check` first (unless the MDB
    /// forces them).
    pub fn with_disruption_check(mut self, check: Arc<dyn DisruptionCheck>) -> Self {
        self.policy.check_disruption = true;
        self.disruption = Some(check);
        self
    }

    /// Every change of a sub's state (after its first) is also sent to `tx`, for the
    /// machine's timeline.
    pub fn with_changes(mut self, tx: mpsc::UnboundedSender<Change>) -> Self {
        self.changes = Some(tx);
        self
    }

    pub fn census(&self) -> Census {
        self.census.clone()
    }

    /// Runs until `stop` turns true: keeps every sub `specs` names on its image; a new
    /// value of `specs` (the MDB changed, an operator paused) is acted on at once.
    /// `now_ms` is a monotonic clock in milliseconds.
    pub async fn run(
        self,
        mut specs: watch::Receiver<Vec<SubSpec>>,
        mut stop: watch::Receiver<bool>,
        now_ms: impl Fn() -> u64 + Send + 'static,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<(String, Outcome)>();
        let (progress, mut progress_rx) = mpsc::unbounded_channel();
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let tasks = Tasks {
            polls: Arc::new(Semaphore::new(self.limits.poll_slots.max(1))),
            trees: Arc::new(Semaphore::new(TREES_PER_CPU * cpus)),
            plans: Arc::new(Semaphore::new(cpus)),
            images: Arc::new(Images::default()),
            tx,
            progress,
        };
        let mut slots: BTreeMap<String, Slot> = BTreeMap::new();
        // Fetches, updates and cleanups waiting for a slot, in order; those running (and
        // whether each is a high-impact update).
        let mut queue: VecDeque<String> = VecDeque::new();
        let mut running: HashMap<String, bool> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut specs_changed = true;
        loop {
            if specs_changed {
                specs_changed = false;
                let now = now_ms();
                let want = specs.borrow_and_update().clone();
                let names: BTreeSet<&String> = want.iter().map(|s| &s.hostname).collect();
                slots.retain(|h, _| names.contains(h));
                for spec in want {
                    match slots.get_mut(&spec.hostname) {
                        Some(slot) if slot.spec != spec => {
                            let cleared = spec.safety_clearance > slot.spec.safety_clearance;
                            slot.spec = spec;
                            if cleared {
                                slot.sub.handle(
                                    Event::ClearSafety,
                                    &slot.spec.desired,
                                    now,
                                    &self.policy,
                                );
                            }
                            slot.sub.desired_changed(now);
                        }
                        Some(_) => {}
                        None => {
                            slots.insert(
                                spec.hostname.clone(),
                                Slot {
                                    spec,
                                    sub: Sub::new(self.policy.backoff()),
                                    computed: None,
                                    queued: None,
                                    report: None,
                                    health: None,
                                    denied_since_ms: None,
                                    fetch: None,
                                    progress_at_ms: None,
                                    since_ms: paddock_clock::now().0,
                                    since_state: "",
                                },
                            );
                        }
                    }
                }
                let wanted: BTreeSet<String> = slots
                    .values()
                    .flat_map(|s| {
                        [
                            &s.spec.desired.required_image,
                            &s.spec.desired.planned_image,
                        ]
                    })
                    .flatten()
                    .cloned()
                    .collect();
                tasks.images.retain(&wanted);
                self.publish_all(&mut slots);
            }
            tokio::select! {
                _ = stop.changed() => {
                    if *stop.borrow() {
                        return;
                    }
                }
                r = specs.changed() => {
                    if r.is_err() {
                        return;
                    }
                    specs_changed = true;
                }
                Some((host, r)) = progress_rx.recv() => {
                    if let Some(slot) = slots.get_mut(&host) {
                        Self::progressed(slot, r, now_ms());
                        self.publish(slot);
                    }
                }
                Some((host, outcome)) = rx.recv() => {
                    let now = now_ms();
                    if matches!(
                        outcome,
                        Outcome::Fetched(_) | Outcome::Updated(_) | Outcome::CleanedUp(_)
                    ) {
                        running.remove(&host);
                    }
                    if let Some(slot) = slots.get_mut(&host) {
                        let mut tree = None;
                        let event = Self::absorb(slot, outcome, &mut tree, now);
                        let action =
                            slot.sub.handle(event, &slot.spec.desired, now, &self.policy);
                        if matches!(
                            slot.sub.state(),
                            SubState::Synced { .. } | SubState::Error { .. }
                        ) {
                            slot.fetch = None;
                        }
                        // The tree goes to the plan, if the sub wants one now; else it is
                        // dropped here (the next poll asks for it again).
                        self.dispatch(&host, slot, action, tree, &tasks, &mut queue);
                        self.publish(slot);
                    }
                    self.admit_queued(&mut slots, &mut queue, &mut running, &tasks, now);
                }
                _ = tick.tick() => {
                    let now = now_ms();
                    for (host, slot) in slots.iter_mut() {
                        if slot.fetch.is_some() && slot.progress_at_ms.is_some_and(|t| t <= now) {
                            slot.progress_at_ms = None;
                            self.ask_progress(host, slot, &tasks);
                        }
                        if slot.sub.busy() || slot.sub.next_at_ms() > now {
                            continue;
                        }
                        let action = slot.sub.handle(Event::Tick, &slot.spec.desired, now, &self.policy);
                        self.dispatch(host, slot, action, None, &tasks, &mut queue);
                        self.publish(slot);
                    }
                    self.admit_queued(&mut slots, &mut queue, &mut running, &tasks, now);
                }
            }
        }
    }

    /// Turns an RPC's outcome into the state machine's event, keeping what later steps
    /// need: a tree that came with a poll goes to `tree`, the computed update is kept
    /// until sent.
    fn absorb(slot: &mut Slot, outcome: Outcome, tree: &mut Option<Tree>, now: u64) -> Event {
        match outcome {
            Outcome::Asked(answer) => {
                match &answer {
                    Disruption::Permitted(why) => {
                        let waited = slot
                            .denied_since_ms
                            .take()
                            .map(|t| format!(" after {} s denied", now.saturating_sub(t) / 1000))
                            .unwrap_or_default();
                        let why = if why.is_empty() {
                            String::new()
                        } else {
                            format!(": {why}")
                        };
                        slot.report.get_or_insert_default().disruption =
                            Some(format!("disruption permitted{waited}{why}"));
                    }
                    Disruption::Denied(_) => {
                        slot.denied_since_ms.get_or_insert(now);
                    }
                }
                Event::Disruption(answer)
            }
            Outcome::Polled(Ok(r), permit) => {
                let r = *r;
                let health = r.last_health_check.as_ref().map(|h| SubHealth {
                    image: h.image_name.clone(),
                    passed: h.outcome.ok,
                    at_ms: h.at_ms,
                });
                // Published with the event's outcome, as every answer is.
                slot.health = health;
                if let (Some(fs), Some(cache)) = (r.file_system, r.object_cache) {
                    *tree = Some(Tree {
                        fs,
                        cache,
                        free_bytes: r.free_space,
                        _slot: permit,
                    });
                }
                Event::Polled(PollAnswer {
                    generation: r.generation,
                    scan_count: r.scan_count,
                    busy: r.fetch_in_progress || r.update_in_progress || r.cleanup_in_progress,
                    stale: r.scan_count <= r.scans_at_last_update,
                })
            }
            Outcome::Polled(Err(e), _) => Event::PollFailed(e.0),
            Outcome::Planned(Ok(Some(mut c))) => {
                let summary = c.summary.clone();
                if summary.empty {
                    slot.denied_since_ms = None;
                    // A synced sub keeps only what it may still send: the objects to clean
                    // up and to preload.
                    c.request = UpdateRequest::default();
                    c.fetch = Vec::new();
                    c.unused.shrink_to_fit();
                    c.preload.shrink_to_fit();
                    slot.computed = (!c.unused.is_empty() || !c.preload.is_empty()).then_some(c);
                } else {
                    let report = slot.report.get_or_insert_default();
                    if report
                        .plan
                        .as_ref()
                        .is_none_or(|p| p.image != summary.image)
                    {
                        report.plan = Some(summary.clone());
                    }
                    slot.computed = Some(c);
                }
                Event::Planned(summary)
            }
            Outcome::Planned(Ok(None)) => {
                Event::ImageMissing(slot.spec.desired.required_image.clone().unwrap_or_default())
            }
            Outcome::Planned(Err(e)) => Event::PlanFailed(e.0),
            Outcome::ComputedMissing(why) => Event::ComputedMissing(why),
            Outcome::Fetched(Ok(reply)) => {
                if let Some(f) = &mut slot.fetch {
                    f.bytes_done = f.bytes_total;
                    f.at_ms = now;
                    f.done = true;
                }
                slot.progress_at_ms = None;
                // Fetched (the update is planned again from a later scan) or preloaded.
                if let (Some(report), Some(stats)) = (&mut slot.report, reply.stats)
                    && matches!(slot.sub.state(), SubState::Fetching { .. })
                {
                    let f = report.fetched.get_or_insert_default();
                    f.objects += stats.objects;
                    f.bytes += stats.bytes;
                    f.seconds += stats.seconds;
                }
                if let Some(c) = &mut slot.computed {
                    c.fetch = Vec::new();
                    c.preload = Vec::new();
                }
                slot.computed = slot.computed.take().filter(|c| !c.unused.is_empty());
                Event::Fetched
            }
            Outcome::Fetched(Err(e)) => {
                slot.fetch = None;
                Event::FetchFailed(e.0)
            }
            Outcome::Updated(Ok(update)) => {
                slot.computed = None;
                let first = update.apply.errors.first().or(update.error.as_ref());
                slot.sub.note_update_error(first.cloned());
                slot.report.get_or_insert_default().update = Some(*update);
                Event::Updated
            }
            Outcome::Updated(Err(e)) => Event::UpdateFailed(e.0),
            Outcome::CleanedUp(Ok(())) => {
                if let Some(c) = &mut slot.computed {
                    c.unused = Vec::new();
                }
                slot.computed = slot.computed.take().filter(|c| !c.preload.is_empty());
                Event::CleanedUp
            }
            Outcome::CleanedUp(Err(e)) => Event::CleanupFailed(e.0),
        }
    }

    fn dispatch(
        &self,
        host: &str,
        slot: &mut Slot,
        action: Action,
        tree: Option<Tree>,
        tasks: &Tasks,
        queue: &mut VecDeque<String>,
    ) {
        if matches!(
            action,
            Action::Fetch { .. } | Action::Update { .. } | Action::Cleanup
        ) {
            // The plan said so (matching triggers against every changed path is not cheap).
            let high_impact = matches!(action, Action::Update { .. })
                && slot.computed.as_ref().is_some_and(|c| c.summary.disruptive);
            slot.queued = Some((action, high_impact));
            queue.push_back(host.to_string());
            return;
        }
        let (host, address, rpc, tx) = self.task_parts(host, slot, tasks);
        match action {
            Action::Wait => {}
            Action::AskDisruption { image } => {
                let triggers = slot
                    .computed
                    .as_ref()
                    .map(|c| {
                        c.request
                            .matched_triggers()
                            .into_iter()
                            .cloned()
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                let mut services: Vec<String> =
                    triggers.iter().map(|t| t.service.clone()).collect();
                services.sort();
                services.dedup();
                let query = DisruptionQuery {
                    hostname: host.clone(),
                    address,
                    image,
                    services,
                    reboot: triggers.iter().any(|t| t.do_reboot),
                    high_impact: triggers.iter().any(|t| t.high_impact),
                };
                let check = self.disruption.clone();
                tokio::spawn(async move {
                    let answer = match check {
                        Some(c) => c.ask(query).await,
                        None => Disruption::Permitted(String::new()),
                    };
                    let _ = tx.send((host, Outcome::Asked(answer)));
                });
            }
            Action::Poll {
                have_generation,
                wait_for_scan_after,
            } => {
                let (polls, trees) = (tasks.polls.clone(), tasks.trees.clone());
                tokio::spawn(async move {
                    // A poll that waits on the sub for a scan takes no poll slot: only subs
                    // just fetched or updated send one (the update slots bound them), and
                    // the routine polls go on meanwhile.
                    let _slot = match wait_for_scan_after {
                        Some(_) => None,
                        None => match polls.acquire_owned().await {
                            Ok(p) => Some(p),
                            Err(_) => return,
                        },
                    };
                    let req = PollRequest {
                        have_generation,
                        wait_for_scan_after,
                        ..PollRequest::default()
                    };
                    let outcome = match rpc.poll_gated(&address, req, &trees).await {
                        Ok(p) => Outcome::Polled(Ok(Box::new(p.answer)), p.tree_slot),
                        Err(e) => Outcome::Polled(Err(e), None),
                    };
                    let _ = tx.send((host, outcome));
                });
            }
            Action::Plan { image } => {
                let Some(tree) = tree else {
                    // The poll said nothing changed but the machine wants a plan: ask for
                    // the tree again.
                    let _ = tx.send((
                        host,
                        Outcome::Planned(Err(RpcError(
                            "the sub's tree was not sent; polling again".into(),
                        ))),
                    ));
                    return;
                };
                let planned = slot.spec.desired.planned_image.clone();
                let overlay = slot.spec.desired.computed.clone();
                let (source, images, plans) = (
                    self.images.clone(),
                    tasks.images.clone(),
                    tasks.plans.clone(),
                );
                tokio::spawn(async move {
                    let required = match images.get(&image, &*source).await {
                        Ok(i) => i,
                        Err(e) => {
                            let _ = tx.send((host, Outcome::Planned(e.map_or(Ok(None), Err))));
                            return;
                        }
                    };
                    let planned_name = planned.clone();
                    let planned = match planned {
                        Some(name) => images.get(&name, &*source).await.ok(),
                        None => None,
                    };
                    let Ok(_cpu) = plans.acquire_owned().await else {
                        return;
                    };
                    let computed = tokio::task::spawn_blocking(move || {
                        // A sub with computed files is planned against its image with them
                        // laid over it (made here, per plan: per-host content makes every
                        // such image its own).
                        let required = match overlay.as_deref() {
                            Some(o) if !o.files.is_empty() => {
                                match crate::overlay::lay(&required.image, o) {
                                    Ok(i) => Arc::new(PreparedImage::new(Arc::new(i))),
                                    Err(e) => return Err(e.to_string()),
                                }
                            }
                            _ => required,
                        };
                        let mut c = compute(
                            &tree.fs,
                            &tree.cache,
                            &required,
                            planned.as_deref(),
                            tree.free_bytes,
                        );
                        if let Some(o) = overlay.as_deref() {
                            for (path, f) in &o.files {
                                let made = c.request.inodes_to_make.iter().any(|(p, _)| p == path);
                                if let (true, Some(argv)) = (made, &f.check) {
                                    c.request.checks.insert(path.clone(), argv.clone());
                                }
                            }
                        }
                        // The name asked for, found or not: the sub plans again only
                        // when the MDB names another.
                        c.summary.planned_image = planned_name;
                        // Freed here, off the async threads (and its tree slot with it).
                        drop(tree);
                        Ok(c)
                    })
                    .await
                    .map_err(|e| RpcError(format!("planning: {e}")));
                    let outcome = match computed {
                        Ok(Ok(c)) => Outcome::Planned(Ok(Some(Box::new(c)))),
                        Ok(Err(missing)) => Outcome::ComputedMissing(missing),
                        Err(e) => Outcome::Planned(Err(e)),
                    };
                    let _ = tx.send((host, outcome));
                });
            }
            Action::Fetch { .. } | Action::Update { .. } | Action::Cleanup => {}
        }
    }

    /// Starts the queued work each sub waits for, in order, while the admission rule
    /// lets it ([`admit`]): a high-impact update held by the share is passed over, not
    /// waited for.
    fn admit_queued(
        &self,
        slots: &mut BTreeMap<String, Slot>,
        queue: &mut VecDeque<String>,
        running: &mut HashMap<String, bool>,
        tasks: &Tasks,
        now: u64,
    ) {
        if queue.is_empty() || running.len() >= self.limits.update_slots.max(1) {
            return;
        }
        let high_limit = high_impact_limit(self.limits.high_impact_share, slots.len());
        let mut kept = VecDeque::new();
        while let Some(host) = queue.pop_front() {
            let Some(slot) = slots.get_mut(&host) else {
                continue;
            };
            let Some((action, high)) = slot.queued.take() else {
                continue;
            };
            let running_high = running.values().filter(|h| **h).count();
            match admit(
                high,
                running.len(),
                running_high,
                self.limits.update_slots,
                high_limit,
            ) {
                Admission::Start => {
                    running.insert(host.clone(), high);
                    slot.sub
                        .handle(Event::Started, &slot.spec.desired, now, &self.policy);
                    self.launch(&host, slot, action, tasks, now);
                    self.publish(slot);
                }
                Admission::HighImpactShare => {
                    slot.queued = Some((action, high));
                    slot.sub.handle(
                        Event::StillQueued(format!(
                            "the share of high-impact updates ({running_high} of at most \
                             {high_limit} running)"
                        )),
                        &slot.spec.desired,
                        now,
                        &self.policy,
                    );
                    self.publish(slot);
                    kept.push_back(host);
                }
                Admission::NoSlot => {
                    slot.queued = Some((action, high));
                    kept.push_back(host);
                    break;
                }
            }
        }
        kept.append(queue);
        *queue = kept;
    }

    /// What an RPC task takes along: the sub's name and address, the RPC, the way back.
    fn task_parts(
        &self,
        host: &str,
        slot: &Slot,
        tasks: &Tasks,
    ) -> (
        String,
        String,
        Arc<R>,
        mpsc::UnboundedSender<(String, Outcome)>,
    ) {
        (
            host.to_string(),
            slot.spec.address.clone(),
            self.rpc.clone(),
            tasks.tx.clone(),
        )
    }

    /// Sends a fetch, update or cleanup whose slot is granted.
    fn launch(&self, host: &str, slot: &mut Slot, action: Action, tasks: &Tasks, now: u64) {
        let (host, address, rpc, tx) = self.task_parts(host, slot, tasks);
        // What the plan says to send; nothing if there is no plan (the sub asks again).
        let planned = |part: fn(&Computed) -> &Vec<ObjectId>| {
            slot.computed
                .as_deref()
                .map(part)
                .cloned()
                .unwrap_or_default()
        };
        match action {
            Action::Fetch { image: _, preload } => {
                let objects = if preload {
                    planned(|c| &c.preload)
                } else {
                    planned(|c| &c.fetch)
                };
                if let (false, SubState::Fetching { bytes, .. }) = (preload, slot.sub.state()) {
                    slot.fetch = Some(FetchProgress {
                        bytes_done: 0,
                        bytes_total: *bytes,
                        started_ms: now,
                        at_ms: now,
                        done: false,
                    });
                    slot.progress_at_ms = Some(now + PROGRESS_EVERY_MS);
                }
                let req = FetchRequest {
                    server: self.limits.image_server.clone(),
                    objects,
                    speed_percent: self.limits.fetch_speed_percent,
                    lock_for_ms: 0,
                    wait: true,
                };
                tokio::spawn(async move {
                    let r = rpc.fetch(&address, req).await;
                    let _ = tx.send((host, Outcome::Fetched(r)));
                });
            }
            Action::Update { image: _ } => {
                let req = slot
                    .computed
                    .as_ref()
                    .map(|c| c.request.clone())
                    .unwrap_or_default();
                tokio::spawn(async move {
                    let r = rpc.update(&address, req).await;
                    let _ = tx.send((host, Outcome::Updated(r.map(Box::new))));
                });
            }
            Action::Cleanup => {
                let objects = planned(|c| &c.unused);
                tokio::spawn(async move {
                    let r = rpc.cleanup(&address, objects).await;
                    let _ = tx.send((host, Outcome::CleanedUp(r)));
                });
            }
            Action::Wait
            | Action::Poll { .. }
            | Action::Plan { .. }
            | Action::AskDisruption { .. } => {}
        }
    }

    fn status(slot: &Slot) -> SubStatus {
        SubStatus {
            hostname: slot.spec.hostname.clone(),
            address: slot.spec.address.clone(),
            required_image: slot.spec.desired.required_image.clone(),
            state: slot.sub.state().clone(),
            summary: slot.sub.state().to_string(),
            failures: slot.sub.failures(),
            health: slot.health.clone(),
            fetch: slot.fetch.clone(),
            since_ms: slot.since_ms,
        }
    }

    /// Short-polls a sub whose fetch runs for the bytes it has written.
    fn ask_progress(&self, host: &str, slot: &Slot, tasks: &Tasks) {
        let (host, address, rpc, _) = self.task_parts(host, slot, tasks);
        let tx = tasks.progress.clone();
        let req = PollRequest {
            short_poll_only: true,
            ..PollRequest::default()
        };
        tokio::spawn(async move {
            let r = rpc.poll(&address, req).await.map(|r| r.fetch_bytes);
            let _ = tx.send((host, r));
        });
    }

    /// A progress poll's answer: the bytes so far while the fetch still runs (a poll that
    /// failed changes nothing; the fetch's own answer says what happened), and the next poll.
    fn progressed(slot: &mut Slot, r: Result<u64, RpcError>, now: u64) {
        let Some(f) = slot.fetch.as_mut().filter(|f| !f.done) else {
            return;
        };
        if let Ok(done) = r {
            f.bytes_done = done.min(f.bytes_total);
            f.at_ms = now;
        }
        slot.progress_at_ms = Some(now + PROGRESS_EVERY_MS);
    }

    /// Moves the sub's `since_ms` (on the wall clock; the herd's steps run on the monotonic
    /// one `run` is given) when it enters a state other than the one it counts from,
    /// passing over the brief steps of polling and computing.
    fn mark_since(slot: &mut Slot) {
        let state = slot.sub.state();
        if !matches!(state, SubState::Polling | SubState::Computing)
            && state.name() != slot.since_state
        {
            slot.since_state = state.name();
            slot.since_ms = paddock_clock::now().0;
        }
    }

    fn publish(&self, slot: &mut Slot) {
        Self::mark_since(slot);
        let mut census = self.census.write().unwrap_or_else(|p| p.into_inner());
        // Most events (a synced sub's short poll) change nothing shown: compared in place,
        // without building the status.
        if census.get(&slot.spec.hostname).is_some_and(|old| {
            old.state == *slot.sub.state()
                && old.failures == slot.sub.failures()
                && old.address == slot.spec.address
                && old.required_image == slot.spec.desired.required_image
                && old.health == slot.health
                && old.fetch == slot.fetch
        }) {
            return;
        }
        let status = Self::status(slot);
        let before = census.get(&status.hostname);
        if before == Some(&status) {
            return;
        }
        // A cycle ends synced or in error: its report goes with that change.
        let ends = matches!(
            status.state,
            SubState::Synced { .. } | SubState::Error { .. }
        );
        let report = if ends { slot.report.take() } else { None };
        if let (Some(tx), Some(old)) = (&self.changes, before)
            && old.summary != status.summary
        {
            let _ = tx.send(Change {
                hostname: status.hostname.clone(),
                state: status.state.clone(),
                report,
            });
        }
        census.insert(status.hostname.clone(), status);
    }

    fn publish_all(&self, slots: &mut BTreeMap<String, Slot>) {
        slots.values_mut().for_each(Self::mark_since);
        let mut census = self.census.write().unwrap_or_else(|p| p.into_inner());
        census.retain(|h, _| slots.contains_key(h));
        for slot in slots.values() {
            census.insert(slot.spec.hostname.clone(), Self::status(slot));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_high_impact_limit_is_a_share_of_the_subs_and_at_least_one() {
        for (share, subs, limit) in [
            (0.1, 20, 2),
            (0.1, 29, 2),
            (0.1, 30, 3),
            (0.1, 5, 1),
            (0.1, 0, 1),
            (0.5, 3, 1),
            (1.0, 7, 7),
            (0.01, 10_000, 100),
        ] {
            assert_eq!(high_impact_limit(share, subs), limit, "{share} × {subs}");
        }
    }

    #[test]
    fn admission_takes_a_slot_and_holds_only_high_impact_updates_to_their_share() {
        use Admission::*;
        // (high impact, running, running high-impact, slots, high limit) → admission
        for (high, running, running_high, slots, limit, want) in [
            (false, 0, 0, 3, 1, Start),
            (false, 2, 0, 3, 1, Start),
            (false, 3, 0, 3, 1, NoSlot),
            // Ordinary work is not held by high-impact updates running.
            (false, 2, 2, 3, 1, Start),
            (true, 0, 0, 3, 1, Start),
            (true, 1, 1, 3, 1, HighImpactShare),
            (true, 2, 1, 3, 2, Start),
            (true, 2, 2, 3, 2, HighImpactShare),
            // No slot comes first.
            (true, 3, 2, 3, 2, NoSlot),
            // A limit of 0 is taken as 1; no slots as one.
            (true, 0, 0, 3, 0, Start),
            (false, 0, 0, 0, 1, Start),
            (false, 1, 0, 0, 1, NoSlot),
        ] {
            assert_eq!(
                admit(high, running, running_high, slots, limit),
                want,
                "high {high}, running {running} ({running_high} high), {slots} slots, limit {limit}"
            );
        }
    }

    #[test]
    fn a_report_says_the_plan_the_fetch_the_change_window_and_the_triggers() {
        let mut update = UpdateReport {
            image_name: "minbase2".into(),
            ..UpdateReport::default()
        };
        update.apply.change_window_ms = 22.4;
        update.trigger_runs = vec![
            paddock_subd_proto::CommandOutcome {
                command: "systemctl restart ssh.service".into(),
                ok: true,
                exit_code: Some(0),
                output: String::new(),
                elapsed_ms: 40,
            },
            paddock_subd_proto::CommandOutcome {
                command: "systemctl start cron.service".into(),
                ok: false,
                exit_code: Some(1),
                output: "no such unit".into(),
                elapsed_ms: 3,
            },
        ];
        update.error = Some("trigger cron.service failed".into());
        let r = ChangeReport {
            plan: Some(PlanSummary {
                image: "minbase2".into(),
                objects_to_fetch: 343,
                fetch_bytes: 15_600_000,
                deletions: 2,
                sub_inodes: 7_000,
                image_inodes: 7_100,
                ..PlanSummary::default()
            }),
            disruption: Some("disruption permitted after 60 s denied: window open".into()),
            fetched: Some(FetchStats {
                objects: 343,
                bytes: 15_600_000,
                seconds: 1.2,
                rate_limit: None,
            }),
            update: Some(update),
        };
        assert_eq!(
            r.describe(),
            "updated to minbase2: plan: 343 objects to fetch (15.6 MB), 2 deletions, \
             7000 → 7100 inodes, disruption permitted after 60 s denied: window open, 343 objects (15.6 MB) fetched in 1.2 s, change window 22 ms, \
             triggers: systemctl restart ssh.service ok, systemctl start cron.service \
             failed (exit 1), errors: trigger cron.service failed"
        );
        let held = ChangeReport {
            plan: r.plan.clone(),
            ..ChangeReport::default()
        };
        assert!(
            held.describe()
                .starts_with("not updated to minbase2: plan: 343")
        );
    }
}
