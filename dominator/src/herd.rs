//! The herd (Dominator's `dom/herd`): the shell that drives one [`Sub`] state machine per
//! machine of the MDB. One task owns every state machine; the RPCs they ask for run as
//! separate tasks, bounded by poll and update slots, and report back over a channel, so a
//! slow or dead sub never holds up another.
//!
//! Memory: a sub's tree is held only between the poll that brought it and the plan that
//! used it; a synced sub keeps its state machine and a few numbers. Images are shared
//! between subs by name ([`ImageSource`] is asked once per image).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock_image::{FileSystem, Image, ObjectId, UpdateRequest};
use paddock_subd::service::{FetchRequest, PollRequest, PollResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::compute::{Computed, compute};
use crate::sub::{Action, Desired, Event, Policy, PollAnswer, Sub, SubState};

/// A failed RPC, as the sub's state will show it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RpcError(pub String);

/// subd's RPC, as the herd uses it (HTTP in the appliance; a simulator in tests and the
/// bench).
#[async_trait]
pub trait SubRpc: Send + Sync + 'static {
    async fn poll(&self, address: &str, req: PollRequest) -> Result<PollResponse, RpcError>;
    async fn fetch(&self, address: &str, req: FetchRequest) -> Result<(), RpcError>;
    async fn update(&self, address: &str, req: UpdateRequest) -> Result<(), RpcError>;
    async fn cleanup(&self, address: &str, objects: Vec<ObjectId>) -> Result<(), RpcError>;
}

/// Where images come from (the image server's index in the appliance).
#[async_trait]
pub trait ImageSource: Send + Sync + 'static {
    /// `Ok(None)`: no such image.
    async fn image(&self, name: &str) -> Result<Option<Arc<Image>>, RpcError>;
}

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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            poll_slots: 200,
            update_slots: 2,
            image_server: String::new(),
            fetch_speed_percent: 10.0,
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
}

/// What a finished RPC brought back.
enum Outcome {
    Polled(Result<Box<PollResponse>, RpcError>),
    Planned(Result<Option<Box<Computed>>, RpcError>),
    Fetched(Result<(), RpcError>),
    Updated(Result<(), RpcError>),
    CleanedUp(Result<(), RpcError>),
}

struct Slot {
    spec: SubSpec,
    sub: Sub,
    /// The tree and cache from the last poll that brought them, until planned.
    tree: Option<Arc<(FileSystem, BTreeSet<ObjectId>)>>,
    free_bytes: Option<u64>,
    computed: Option<Box<Computed>>,
}

/// The herd's shared view, for the API and metrics.
pub type Census = Arc<std::sync::RwLock<BTreeMap<String, SubStatus>>>;

pub struct Herd<R: SubRpc, I: ImageSource> {
    rpc: Arc<R>,
    images: Arc<I>,
    policy: Policy,
    limits: Limits,
    census: Census,
    changes: Option<mpsc::UnboundedSender<(String, SubState)>>,
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
        }
    }

    /// Every change of a sub's state (after its first) is also sent to `tx`, for the
    /// machine's timeline.
    pub fn with_changes(mut self, tx: mpsc::UnboundedSender<(String, SubState)>) -> Self {
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
        let polls = Arc::new(Semaphore::new(self.limits.poll_slots.max(1)));
        let updates = Arc::new(Semaphore::new(self.limits.update_slots.max(1)));
        let (tx, mut rx) = mpsc::unbounded_channel::<(String, Outcome)>();
        let mut slots: BTreeMap<String, Slot> = BTreeMap::new();
        let mut images: HashMap<String, Arc<Image>> = HashMap::new();
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
                                    sub: Sub::new(),
                                    tree: None,
                                    free_bytes: None,
                                    computed: None,
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
                images.retain(|name, _| wanted.contains(name));
                self.publish_all(&slots);
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
                Some((host, outcome)) = rx.recv() => {
                    let now = now_ms();
                    let Some(slot) = slots.get_mut(&host) else { continue };
                    let event = self.absorb(slot, outcome);
                    let action = slot.sub.handle(event, &slot.spec.desired, now, &self.policy);
                    self.dispatch(&host, slot, action, &mut images, &polls, &updates, &tx);
                    self.publish(slot);
                }
                _ = tick.tick() => {
                    let now = now_ms();
                    for (host, slot) in slots.iter_mut() {
                        if slot.sub.busy() || slot.sub.next_at_ms() > now {
                            continue;
                        }
                        let action = slot.sub.handle(Event::Tick, &slot.spec.desired, now, &self.policy);
                        self.dispatch(host, slot, action, &mut images, &polls, &updates, &tx);
                        self.publish(slot);
                    }
                }
            }
        }
    }

    /// Turns an RPC's outcome into the state machine's event, keeping what later steps
    /// need (the tree until planned, the computed update until sent).
    fn absorb(&self, slot: &mut Slot, outcome: Outcome) -> Event {
        match outcome {
            Outcome::Polled(Ok(r)) => {
                let r = *r;
                if let (Some(fs), Some(cache)) = (r.file_system, r.object_cache) {
                    slot.tree = Some(Arc::new((fs, cache)));
                }
                slot.free_bytes = r.free_space;
                Event::Polled(PollAnswer {
                    generation: r.generation,
                    scan_count: r.scan_count,
                    busy: r.fetch_in_progress || r.update_in_progress || r.cleanup_in_progress,
                })
            }
            Outcome::Polled(Err(e)) => Event::PollFailed(e.0),
            Outcome::Planned(Ok(Some(c))) => {
                let summary = c.summary.clone();
                slot.computed = Some(c);
                if summary.empty {
                    // Synced subs keep no tree.
                    slot.tree = None;
                }
                Event::Planned(summary)
            }
            Outcome::Planned(Ok(None)) => {
                Event::ImageMissing(slot.spec.desired.required_image.clone().unwrap_or_default())
            }
            Outcome::Planned(Err(e)) => Event::PlanFailed(e.0),
            Outcome::Fetched(Ok(())) => Event::Fetched,
            Outcome::Fetched(Err(e)) => Event::FetchFailed(e.0),
            Outcome::Updated(Ok(())) => {
                slot.computed = None;
                slot.tree = None;
                Event::Updated
            }
            Outcome::Updated(Err(e)) => Event::UpdateFailed(e.0),
            Outcome::CleanedUp(Ok(())) => Event::CleanedUp,
            Outcome::CleanedUp(Err(e)) => Event::CleanupFailed(e.0),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        host: &str,
        slot: &mut Slot,
        action: Action,
        images: &mut HashMap<String, Arc<Image>>,
        polls: &Arc<Semaphore>,
        updates: &Arc<Semaphore>,
        tx: &mpsc::UnboundedSender<(String, Outcome)>,
    ) {
        let (host, address, rpc, tx) = (
            host.to_string(),
            slot.spec.address.clone(),
            self.rpc.clone(),
            tx.clone(),
        );
        match action {
            Action::Wait => {}
            Action::Poll { have_generation } => {
                let polls = polls.clone();
                tokio::spawn(async move {
                    let _slot = polls.acquire_owned().await;
                    let req = PollRequest {
                        have_generation,
                        ..PollRequest::default()
                    };
                    let r = rpc.poll(&address, req).await;
                    let _ = tx.send((host, Outcome::Polled(r.map(Box::new))));
                });
            }
            Action::Plan { image } => {
                let Some(tree) = slot.tree.clone() else {
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
                let free = slot.free_bytes;
                let cached = (
                    images.get(&image).cloned(),
                    planned.as_ref().and_then(|p| images.get(p).cloned()),
                );
                let source = self.images.clone();
                let polls = polls.clone();
                tokio::spawn(async move {
                    let _slot = polls.acquire_owned().await;
                    let required = match cached.0 {
                        Some(i) => Some(i),
                        None => match source.image(&image).await {
                            Ok(i) => i,
                            Err(e) => {
                                let _ = tx.send((host, Outcome::Planned(Err(e))));
                                return;
                            }
                        },
                    };
                    let Some(required) = required else {
                        let _ = tx.send((host, Outcome::Planned(Ok(None))));
                        return;
                    };
                    let planned = match (cached.1, planned) {
                        (Some(p), _) => Some(p),
                        (None, Some(name)) => source.image(&name).await.ok().flatten(),
                        (None, None) => None,
                    };
                    let computed = tokio::task::spawn_blocking(move || {
                        compute(&tree.0, &tree.1, &required, planned.as_deref(), free)
                    })
                    .await
                    .map_err(|e| RpcError(format!("planning: {e}")));
                    let _ = tx.send((host, Outcome::Planned(computed.map(|c| Some(Box::new(c))))));
                });
            }
            Action::Fetch { image: _, preload } => {
                let objects = slot
                    .computed
                    .as_ref()
                    .map(|c| {
                        if preload {
                            c.preload.clone()
                        } else {
                            c.fetch.clone()
                        }
                    })
                    .unwrap_or_default();
                let req = FetchRequest {
                    server: self.limits.image_server.clone(),
                    objects,
                    speed_percent: self.limits.fetch_speed_percent,
                    lock_for_ms: 0,
                    wait: true,
                };
                let updates = updates.clone();
                tokio::spawn(async move {
                    let _slot = updates.acquire_owned().await;
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
                let updates = updates.clone();
                tokio::spawn(async move {
                    let _slot = updates.acquire_owned().await;
                    let r = rpc.update(&address, req).await;
                    let _ = tx.send((host, Outcome::Updated(r)));
                });
            }
            Action::Cleanup => {
                let objects = slot
                    .computed
                    .as_ref()
                    .map(|c| c.unused.clone())
                    .unwrap_or_default();
                let updates = updates.clone();
                tokio::spawn(async move {
                    let _slot = updates.acquire_owned().await;
                    let r = rpc.cleanup(&address, objects).await;
                    let _ = tx.send((host, Outcome::CleanedUp(r)));
                });
            }
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
        }
    }

    fn publish(&self, slot: &Slot) {
        let status = Self::status(slot);
        let mut census = self.census.write().unwrap_or_else(|p| p.into_inner());
        let before = census.get(&status.hostname);
        if before == Some(&status) {
            return;
        }
        if let (Some(tx), Some(old)) = (&self.changes, before)
            && old.summary != status.summary
        {
            let _ = tx.send((status.hostname.clone(), status.state.clone()));
        }
        census.insert(status.hostname.clone(), status);
    }

    fn publish_all(&self, slots: &BTreeMap<String, Slot>) {
        let mut census = self.census.write().unwrap_or_else(|p| p.into_inner());
        census.retain(|h, _| slots.contains_key(h));
        for slot in slots.values() {
            census.insert(slot.spec.hostname.clone(), Self::status(slot));
        }
    }
}
